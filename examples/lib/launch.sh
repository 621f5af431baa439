# shellcheck shell=bash
# Shared by examples/*/train_*.sh: resolve the launch in Python (training.launch), which
# prints the toggle table and refuses unsafe combinations, then define its buckets here.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$REPO_ROOT/.venv/bin/python" ]; then PYTHON="$REPO_ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
# torchrun from the same Python installation; the package importable from anywhere.
PATH="$(dirname "$(command -v "$PYTHON")"):$PATH"
export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"

# resolve_launch FAMILY [KEY=VALUE ...] [--megatron-flags ...]
# Defines GPT_ARGS TRAIN_ARGS DATA_ARGS OUTPUT_ARGS EXTRA_ARGS DISTRIBUTED_ARGS USER_ARGS
# PROFILER_PREFIX SUPERVISOR_ARGS (arrays), LOG_DIR, LOG_FILE (train.log; train.node<N>.log when NNODES > 1),
# LAUNCH_LINE, DRY_RUN, TEE_OUTPUT, and exports the environment presets. The launcher's
# command line (training.launch) with the memory pre-flight (PREFLIGHT_MEMORY, docs/optimize.md).
resolve_launch() {
    resolve_launch_with training.optimize.preflight "$@"
}

# resolve_launch_with MODULE FAMILY [...]: the same through another entry module, the launcher's
# command line with that module's additions (examples/moe: training.moe.launch, which registers
# the MoE presets and adds its recipe layer, with the same pre-flight).
resolve_launch_with() {
    local module=$1 family=$2 resolved
    shift 2
    resolved=$("$PYTHON" -m "$module" --family "$family" "$@") || exit $?
    eval "$resolved"
}

# print_buckets: the run folder and the torchrun line (wrapped, still one command), last; with
# VERBOSE=1 each bucket by name first and the line unwrapped. Exits here when DRY_RUN=1.
print_buckets() {
    if [ "$VERBOSE" = 1 ]; then
        echo "GPT_ARGS:    ${GPT_ARGS[*]}"
        echo "TRAIN_ARGS:  ${TRAIN_ARGS[*]}"
        echo "DATA_ARGS:   ${DATA_ARGS[*]}"
        echo "OUTPUT_ARGS: ${OUTPUT_ARGS[*]}"
        echo "EXTRA_ARGS:  ${EXTRA_ARGS[*]} ${USER_ARGS[*]}"
        echo "DISTRIBUTED_ARGS: ${DISTRIBUTED_ARGS[*]}"
        echo "SUPERVISOR_ARGS: ${SUPERVISOR_ARGS[*]}"
    fi
    echo "LOG_DIR=$LOG_DIR"
    # the log's name when it is not the run folder's train.log (one per node of several)
    if [ "$VERBOSE" = 1 ] || [ "$LOG_FILE" != "$LOG_DIR/train.log" ]; then echo "LOG_FILE=$LOG_FILE"; fi
    if [ "$VERBOSE" = 1 ]; then echo "$LAUNCH_LINE"; else echo "$LAUNCH_LINE_WRAPPED"; fi
    if [ "$DRY_RUN" = 1 ]; then exit 0; fi
    mkdir -p "$LOG_DIR"
}

# exec_torchrun: this node's output goes to LOG_FILE (and the console, unless TEE_OUTPUT=0),
# then the launch replaces the shell:
#   [supervisor --] [nsys ...] torchrun DISTRIBUTED_ARGS training/pretrain_gpt.py GPT_ARGS
#       TRAIN_ARGS DATA_ARGS OUTPUT_ARGS EXTRA_ARGS USER_ARGS
# The supervisor (training/resilience/supervise.py, with SUPERVISOR_ARGS) forwards a stop signal
# to the workers (save, exit 75 to requeue), restarts a failed run (RESTARTS) and ends a hung
# one (HANG_TIMEOUT).
exec_torchrun() {
    local supervisor=()
    if [ -n "${SUPERVISOR_ARGS+set}" ]; then
        supervisor=("$PYTHON" -m training.resilience.supervise "${SUPERVISOR_ARGS[@]}" --)
    fi
    # tee ignores the stop signals (Ctrl-C reaches the whole terminal group, Slurm's SIGUSR2
    # every process of the job): it ends when the run's output does, so nothing is lost while
    # the run saves and stops
    if [ "${TEE_OUTPUT:-1}" = 0 ]; then exec >> "$LOG_FILE" 2>&1
    else exec > >(trap '' INT TERM HUP USR2; exec tee -a "$LOG_FILE") 2>&1; fi
    exec "${supervisor[@]}" "${PROFILER_PREFIX[@]}" torchrun "${DISTRIBUTED_ARGS[@]}" "$REPO_ROOT/training/pretrain_gpt.py" \
        "${GPT_ARGS[@]}" "${TRAIN_ARGS[@]}" "${DATA_ARGS[@]}" "${OUTPUT_ARGS[@]}" "${EXTRA_ARGS[@]}" \
        "${USER_ARGS[@]}"
}
