"""`python -m training.launch --family llama3 [KEY=VALUE ...] [--megatron-flags ...]`

Called by examples/*/train_*.sh. Prints the toggle table on stderr and, on stdout, shell
assignments for the script to `eval`: the buckets as bash arrays, the supervisor's options
(SUPERVISOR_ARGS, training.resilience.supervise), LOG_DIR, LOG_FILE (this
node's log: train.log, or train.node<N>.log when NNODES > 1), the launch line and
the environment presets, TEE_OUTPUT. Every value is shell-quoted: nothing a user typed is
executed.
Exit 2 with one message (no traceback) when the input is bad or a guard refuses.
"""
from __future__ import annotations

import os
import shlex
import sys

from training.cli import ArgumentParser, BadFile

from .environment import SHELL_NAME
from training.credentials import mask_text
from .settings import BadInput, LaunchError


def shell_assignments(launch) -> str:
    from .report import wrapped_command
    from .runfolder import node_log_name
    from .toggles import DISTRIBUTED_ARGS, MEGATRON_BUCKETS

    q = shlex.quote
    lines = []
    for bucket in (*MEGATRON_BUCKETS, DISTRIBUTED_ARGS):
        lines.append(f"{bucket}=({' '.join(q(w) for w in launch.buckets[bucket])})")
    lines.append(f"USER_ARGS=({' '.join(q(w) for w in launch.user_args)})")
    lines.append(f"PROFILER_PREFIX=({' '.join(q(w) for w in launch.profiler_prefix)})")
    lines.append(f"SUPERVISOR_ARGS=({' '.join(q(w) for w in launch.supervisor_args)})")
    lines.append(f"LOG_DIR={q(str(launch.log_dir))}")
    log_name = node_log_name(launch.settings["NNODES"], launch.settings["NODE_RANK"])
    lines.append(f"LOG_FILE={q(str(launch.log_dir / log_name))}")
    lines.append(f"LAUNCH_LINE={q(mask_text(launch.command_line))}")   # printed, never run
    wrapped = wrapped_command(launch.command, _columns(), str(launch.log_dir))
    lines.append(f"LAUNCH_LINE_WRAPPED={q(mask_text(wrapped))}")   # printed, never run
    lines.append(f"VERBOSE={1 if launch.settings['VERBOSE'] else 0}")
    lines.append(f"DRY_RUN={1 if launch.settings['DRY_RUN'] else 0}")
    lines.append(f"TEE_OUTPUT={1 if launch.settings['TEE_OUTPUT'] else 0}")
    exports = [*((name, value) for name, (value, _s, _r) in launch.env.items()),
               *launch.passthrough_env.items()]
    for name, value in exports:
        if not SHELL_NAME.fullmatch(name):   # resolve admits none; never hand bash another
            raise BadInput(f"{name!r} is not a variable name bash can export.")
        lines.append(f"export {name}={q(value)}")
    return "\n".join(lines) + "\n"


def _columns() -> int:
    """The width the launch is read at: COLUMNS, else the terminal's (stderr), else 80."""
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    try:
        return os.get_terminal_size(2).columns
    except OSError:
        return 80


def _split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """The launcher's own options lead (examples/lib/launch.sh puts them first); every word
    after them is the user's: KEY=VALUE words and Megatron --flags. Split by hand because
    argparse's REMAINDER refuses a user word list that starts with a --flag
    (`train_llama3.sh --ckpt-step 10`)."""
    own, i = [], 0
    while i < len(argv):
        word = argv[i]
        if word == "--family":
            own += argv[i:i + 2]
            i += 2
        elif word.startswith("--family=") or word in ("--no-manifest", "-h", "--help"):
            own.append(word)
            i += 1
        else:
            break
    return own, argv[i:]


def main(argv: list[str] | None = None, layers=(), checks=(), choosers=(),
         prog: str = "python -m training.launch") -> int:
    """`layers`: a family's recipe layers (training/launch/layers.py), passed by its own entry
    point (training.moe.launch); the core knows none. `checks`: functions of the resolved
    Launch run before anything is printed or written (a refusal is a LaunchError): how a reader
    plugs a check in from above (the memory pre-flight: python -m training.optimize.preflight).
    `choosers`: resolve's, values nobody set chosen from above (the pre-flight's micro-batch)."""
    parser = ArgumentParser(prog=prog,
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", required=True, help="model family: llama3 | llama2")
    parser.add_argument("--no-manifest", action="store_true",
                        help="do not write the run folder's manifest.json")
    own, words = _split_argv(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)

    from .manifest import write_launch_manifest
    from .report import print_report, write_table
    from .resolve import resolve

    try:
        launch = resolve(args.family, dict(os.environ), words, layers=layers,
                         choosers=choosers)
        for check in checks:
            check(launch)
        shell_text = shell_assignments(launch)
    except LaunchError as err:
        print(f"error: {mask_text(str(err))}", file=sys.stderr)
        return err.exit_code
    print_report(launch)
    if not args.no_manifest and launch.settings["NODE_RANK"] == 0:
        try:
            write_launch_manifest(launch)
            write_table(launch)
        except OSError as err:   # the guard run_folder checked it; the disk may still refuse
            print(f"error: cannot write {launch.log_dir / 'manifest.json'}: "
                  f"{err.strerror or err}", file=sys.stderr)
            return 2
        except BadFile as err:   # a link or FIFO put there since the guard looked
            print(f"error: {mask_text(str(err))}", file=sys.stderr)
            return 2
    sys.stdout.write(shell_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
