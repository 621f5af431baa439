"""`make train`'s first step: stop with one clear line on a machine with no GPU."""
from __future__ import annotations

import sys

from training.launch.capabilities import detect


def main() -> int:
    caps = detect()
    if caps.gpu_count == 0:
        print("make train: no GPU is visible on this machine; to see the resolved launch "
              "without one, run: DRY_RUN=1 bash examples/llama/train_llama3.sh", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
