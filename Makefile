# Two commands on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
LOGDIR ?= demo_logs
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install demo test lint clean gpu-check

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: requirements-ci.txt pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -r requirements-ci.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python examples/keras_digits.py --logdir $(LOGDIR)/keras --epochs 3

lint: install
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/ruff format --check src tests examples benchmarks
	$(BIN)/mypy

# Two pytest workers: most of the suite's time is child processes and sleep-modelled waits, which leave a core
# idle; each test module runs in one worker (its module-scoped child runs once). TEST_WORKERS=0 runs in one process.
# Three were faster (pytest 6 min 47 s against 8 min 2 s, quiet, 2026-12-01), but in 2 of 5 runs on a loaded machine
# a timing check failed (a loader's busy share 12 pp from its truth; JAX's input share 3.9 pp, since made sturdier).
TEST_WORKERS ?= 2

# The machine's load is printed before and after (timing tests skip, naming it, when contention spoils them:
# tests/contention.py). tests/conftest.py names each failure and error on its own line as it happens; pyproject's
# -ra lists them again at the end with the skips' reasons (a -r here would replace it).
test: lint
	@echo "load at start: $$(cat /proc/loadavg 2>/dev/null || echo unknown) ($$(nproc 2>/dev/null || echo ?) cores)"
	@status=0; $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=20 tests || status=$$?; \
	echo "load at end: $$(cat /proc/loadavg 2>/dev/null || echo unknown)"; exit $$status

# The device check (benchmarks/gpu_check.py): on a CUDA GPU, with torch, lightning, tensorboard and fitprof's core
# dependencies already installed (no venv, no network). GPU_CHECK_ARGS="--dry" runs its logic on the CPU.
gpu-check:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(PY) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) $(LOGDIR)
