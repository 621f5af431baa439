"""The `docker run` command that runs an example script inside this project's image.

    python -m training.deploy.docker [SCRIPT] [KEY=VALUE ...] [--megatron-flags]

runs that command (launchers/docker_run.sh execs this module; nothing a user typed is
evaluated by a shell: the command is an argument list, the secrets ride in docker's own
environment). What the command holds:

  vendor    from PLATFORM (env or word), else this host: nvidia-smi or /dev/nvidiactl -> NVIDIA,
            /dev/kfd -> AMD
  devices   NVIDIA: --gpus all; AMD: --device /dev/kfd --device /dev/dri --group-add video
            --security-opt seccomp=unconfined; both: /dev/infiniband when the host has it
  sharing   --ipc host, --shm-size, memlock/stack ulimits, --network host (multi-node NCCL)
  mounts    the repository, at the same path (so every path means the same inside); the
            folders of DATA_PATH/VALID_DATA_PATH prefixes, TOKENIZER_MODEL, LOAD, SAVE,
            EXPERIMENT_DIR. A DATA_PATH whose files are not on this host is refused (exit 2).
  env       every toggle you set (NNODES, TP, ...; the ROCm fork's variables too: SEQ_PARALLEL,
            TEE_OUTPUT, ...), the launcher's environment presets and
            NCCL_/RCCL_/HSA_/HIP_/NVTE_ variables you set; names in DOCKER_ENV are passed by
            name (-e NAME: the value stays out of the printed command, e.g. HF_TOKEN), and so
            is every secret (training/credentials.py: a name such as DB_PASS or GITHUB_PAT,
            or a value holding user:password@ or ?token=): a KEY=VALUE word of one is put in
            docker's environment for `-e NAME` to read instead of riding on the command line
  image     DOCKER_IMAGE, else training:cuda / training:rocm (built from docker/, docs/launch.md)

DRY_RUN=1 in the environment prints the command (secrets masked) and runs nothing; a DRY_RUN=1 word is passed
to the script inside (the container prints the launch table). Standard library only: the host
that drives docker may have no project environment.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from training import REPO_ROOT
from training.launch.environment import PRESETS, SHELL_NAME, USER_FAMILIES
from training.credentials import mask_text, secret_pair
from training.deploy.scripts import example_script
from training.launch.runfolder import git_sha
from training.launch.settings import BadInput, LaunchError
from training.launch.fork_vars import BY_NAME as FORK_VARIABLES
from training.launch.toggles import BY_ALIAS, BY_NAME
from training.platforms import PLATFORMS

DEFAULT_SCRIPT = "examples/llama/train_llama3.sh"
DEFAULT_IMAGES = {"nvidia": "training:cuda", "amd": "training:rocm"}
DEFAULT_SHM = "64g"
VENDOR_FLAGS = {
    "nvidia": ["--gpus", "all"],
    "amd": ["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video",
            "--security-opt", "seccomp=unconfined"],
}
COMMON_FLAGS = ["--rm", "--network", "host", "--ipc", "host", "--ulimit", "memlock=-1",
                "--ulimit", "stack=67108864"]
# Variables a GPU run inside the container should see as on the host (device selection).
DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
# Consumed here, never passed inside.
OUTER_ONLY = ("DRY_RUN",)
PATH_TOGGLES = ("TOKENIZER_MODEL", "LOAD", "SAVE", "EXPERIMENT_DIR")

# docker's image reference grammar (distribution/reference): an optional registry host[:port],
# lower-case path components, an optional tag and digest. Nothing else reaches docker's argv
# where the image goes.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(
    rf"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?")
SHM_SIZE = re.compile(r"[0-9]+[bkmgBKMG]?")


@dataclass(frozen=True)
class HostFacts:
    """What this host has; tests build one by hand."""
    nvidia: bool
    amd: bool
    infiniband: bool
    cwd: Path
    git_sha: str | None = None

    @classmethod
    def detect(cls) -> HostFacts:
        return cls(nvidia=shutil.which("nvidia-smi") is not None
                   or Path("/dev/nvidiactl").exists(),
                   amd=Path("/dev/kfd").exists(), infiniband=Path("/dev/infiniband").is_dir(),
                   cwd=Path.cwd(), git_sha=git_sha(REPO_ROOT))


@dataclass
class DockerPlan:
    argv: list[str]
    dry_run: bool
    vendor: str
    mounts: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    exports: dict[str, str] = field(default_factory=dict)  # secret words: docker reads them

    @property
    def line(self) -> str:
        """The command as printed: no secret's value is in argv; masked once more for safety."""
        return mask_text(shlex.join(self.argv))


def split_args(args: list[str]) -> tuple[str, dict[str, str], list[str]]:
    """[SCRIPT] [KEY=VALUE ...] [--flags]: the script, the assignments, all words after it."""
    script = DEFAULT_SCRIPT
    if args and args[0].endswith(".sh"):
        script, args = args[0], args[1:]
    assignments: dict[str, str] = {}
    for word in args:
        if word.startswith("--"):
            break
        if "=" in word:
            key, value = word.split("=", 1)
            if not SHELL_NAME.fullmatch(key):
                raise BadInput(f"{mask_text(word)!r}: {key!r} is not a variable name (letters, "
                               "digits and _): give KEY=VALUE words, e.g. TP=2.")
            if key in assignments:
                raise BadInput(f"{key} is given twice after the script name: give it once.")
            assignments[key] = value
    return script, assignments, list(args)


def _vendor(environ: dict[str, str], words: dict[str, str], facts: HostFacts) -> str:
    platform = words.get("PLATFORM") or environ.get("PLATFORM") or "auto"
    if platform != "auto":
        if platform not in PLATFORMS:
            raise BadInput(f"PLATFORM={platform!r} is not accepted: use one of "
                           f"{', '.join(PLATFORMS)} (or leave it unset to detect this host).")
        return PLATFORMS[platform].vendor
    if facts.nvidia and facts.amd:
        raise BadInput("this host has both NVIDIA and AMD GPU devices: set PLATFORM=<name> "
                       "to say which image to run.")
    if facts.nvidia:
        return "nvidia"
    if facts.amd:
        return "amd"
    raise BadInput("no GPU found on this host (no nvidia-smi, /dev/nvidiactl or /dev/kfd), so "
                   "the docker device flags cannot be chosen: run on a GPU host, or set "
                   "PLATFORM=<name> with DRY_RUN=1 to print the command for one.")


def _data_prefixes(value: str) -> list[str]:
    """Prefixes of a DATA_PATH blend ('p', 'p1 p2' or 'w1 p1 w2 p2')."""
    prefixes = []
    for token in value.split():
        try:
            float(token)
        except ValueError:
            prefixes.append(token)
    return prefixes


def _absolute(path: str, workdir: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else workdir / p


def _mount_dirs(settings: dict[str, str], workdir: Path) -> list[Path]:
    """Host folders the run reads or writes, checked to exist where they must."""
    dirs: list[Path] = []
    for name in ("DATA_PATH", "VALID_DATA_PATH"):
        value = settings.get(name, "")
        if not value.strip():
            continue
        for prefix in _data_prefixes(value):
            base = _absolute(prefix, workdir)
            missing = [f"{base}{ext}" for ext in (".bin", ".idx")
                       if not Path(f"{base}{ext}").is_file()]
            if missing:
                raise BadInput(
                    f"{name} prefix {prefix!r}: {', '.join(missing)} not found on this host. "
                    "The container sees only folders mounted from here, so the run would find "
                    f"no data: point {name} at the dataset prefix on this host (without "
                    ".bin/.idx), or unset DATA_PATH for mock data.")
            dirs.append(base.parent)
    for name in PATH_TOGGLES:
        value = settings.get(name, "")
        if not value.strip():
            continue
        path = _absolute(value, workdir)
        if name in ("TOKENIZER_MODEL", "LOAD") and not path.exists():
            raise BadInput(f"{name}={value!r}: {path} does not exist on this host, so the "
                           f"container cannot see it. Point {name} at an existing path here.")
        dirs.append(path if path.is_dir() or name in ("SAVE", "EXPERIMENT_DIR") else path.parent)
    return dirs


def _covering(dirs: list[Path]) -> list[Path]:
    """Drop folders inside another mounted folder; keep order."""
    out: list[Path] = []
    for d in dirs:
        d = Path(os.path.normpath(d))
        if any(d == m or m in d.parents for m in out):
            continue
        out = [m for m in out if d not in m.parents] + [d]
    return out


def _env_words(environ: dict[str, str], facts: HostFacts, inner_dry_run: bool) -> list[str]:
    names = []
    preset_names = {p.name for p in PRESETS}
    for name in sorted(environ):
        if name in OUTER_ONLY or not environ[name].strip():
            continue
        if name == "PLATFORM" and not inner_dry_run:
            continue  # it chose the vendor flags; inside, the launcher detects the real GPUs
        if (name in BY_NAME or name in BY_ALIAS or name in FORK_VARIABLES
                or name in preset_names or name in DEVICE_VARS
                or name.startswith(USER_FAMILIES)):
            names.append(name)
    words = []
    for name in names:
        words += ["-e", name if secret_pair(name, environ[name]) else f"{name}={environ[name]}"]
    words += ["-e", "PYTHON=python3"]  # the image's Python, never the host's .venv in the repo
    sha = environ.get("GIT_SHA") or facts.git_sha
    if sha and "GIT_SHA" not in names:
        words += ["-e", f"GIT_SHA={sha}"]  # the repo's .git may not be readable inside
    for name in environ.get("DOCKER_ENV", "").replace(",", " ").split():
        if not SHELL_NAME.fullmatch(name):
            raise BadInput(f"DOCKER_ENV names {name!r}, which is not a variable name: give "
                           "names separated by spaces or commas, e.g. DOCKER_ENV=HF_TOKEN.")
        if name not in names:
            words += ["-e", name]
    return words


def docker_plan(environ: dict[str, str], args: list[str], facts: HostFacts,
                repo: Path = REPO_ROOT) -> DockerPlan:
    script, assignments, words = split_args(args)
    script_path = example_script(script, repo, facts.cwd)
    dry_run = environ.get("DRY_RUN", "0").strip() == "1"
    vendor = _vendor(environ, assignments, facts)
    platform = assignments.get("PLATFORM") or environ.get("PLATFORM") or "auto"
    inner_dry = (assignments.get("DRY_RUN") == "1")
    if platform != "auto" and not dry_run and not inner_dry:
        raise BadInput(f"PLATFORM={platform} describes another machine, and a real run detects "
                       "this host's GPUs inside the container: unset PLATFORM, or use DRY_RUN=1 "
                       "to print the docker command.")

    workdir = facts.cwd if (facts.cwd == repo or repo in facts.cwd.parents) else repo
    keys = ("DATA_PATH", "VALID_DATA_PATH", *PATH_TOGGLES)
    settings = {k: environ[k] for k in keys if k in environ}
    settings.update({k: assignments[k] for k in keys if k in assignments})  # words win
    mounts = _covering([repo, *_mount_dirs(settings, workdir)])

    image = environ.get("DOCKER_IMAGE") or DEFAULT_IMAGES[vendor]
    if not IMAGE_REFERENCE.fullmatch(image):
        raise BadInput(f"DOCKER_IMAGE={image!r} is not an image reference ([registry/]name"
                       "[:tag][@sha256:digest], lower-case name): docker would read it as "
                       "something else (a word starting with '-' is an option of docker run)")
    shm = environ.get("DOCKER_SHM_SIZE") or DEFAULT_SHM
    if not SHM_SIZE.fullmatch(shm):
        raise BadInput(f"DOCKER_SHM_SIZE={shm!r} is not a size (a number and b, k, m or g: "
                       f"e.g. {DEFAULT_SHM})")
    argv = ["docker", "run", *COMMON_FLAGS, "--shm-size", shm, *VENDOR_FLAGS[vendor]]
    if facts.infiniband:
        argv += ["--device", "/dev/infiniband"]
    for m in mounts:
        argv += ["-v", f"{m}:{m}"]
    # a secret given as a word after the script: by name, its value exported for docker
    exports = {k: v for k, v in assignments.items() if secret_pair(k, v)}
    first_flag = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
    words = [w for i, w in enumerate(words)
             if i >= first_flag or w.split("=", 1)[0] not in exports]
    env_words = _env_words(environ, facts, inner_dry)
    for name in exports:
        if name not in env_words:
            env_words += ["-e", name]
    argv += ["-w", str(workdir), *env_words, image, "bash", str(script_path), *words]
    notes = []
    if platform != "auto" and not inner_dry:
        notes.append(f"PLATFORM={platform} chose the {vendor} device flags and image; it is not "
                     "passed into the container, where the launcher detects the real GPUs.")
    return DockerPlan(argv, dry_run, vendor, mounts, notes, exports)


def create_writable_dirs(plan: DockerPlan, environ: dict[str, str], args: list[str],
                         facts: HostFacts) -> None:
    """Before a real run: SAVE/EXPERIMENT_DIR exist, owned by you (docker would create a
    missing bind-mount source as root)."""
    _, assignments, _ = split_args(args)
    for name in ("SAVE", "EXPERIMENT_DIR"):
        value = assignments.get(name) or environ.get(name)
        if value:
            path = _absolute(value, facts.cwd)
            if path in plan.mounts:
                path.mkdir(parents=True, exist_ok=True)


def run(plan: DockerPlan, environ: dict[str, str]) -> None:
    """Replace this process with docker: the secret words in its environment (read by -e NAME)."""
    os.execvpe(plan.argv[0], plan.argv, {**environ, **plan.exports})


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    environ = dict(os.environ)
    facts = HostFacts.detect()
    try:
        plan = docker_plan(environ, args, facts)
        if not plan.dry_run:
            create_writable_dirs(plan, environ, args, facts)
    except LaunchError as err:
        print(f"error: {mask_text(str(err))}", file=sys.stderr)
        return err.exit_code
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)
    if plan.dry_run:
        print(plan.line)
        return 0
    sys.stdout.flush()
    try:
        run(plan, environ)
    except OSError as err:
        print(f"error: cannot run {plan.argv[0]}: {err.strerror or err}: install docker or "
              "put it on PATH.", file=sys.stderr)
        return 2
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
