# The README's two commands: `make run` (the default training job) and `make test`.
# Both create .venv if missing and install the project first; both are idempotent.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Installed first, exactly: on CPU machines this version is a CPU build that lies on disk,
# while an open range can pull a multi-GB CUDA build. GPU clusters bring their own torch:
# an importable torch in the venv is left alone. The project itself asks for a range.
TORCH_VERSION ?= 2.13.0
ARGS ?=

.PHONY: install run test test-fast lint cluster-up cluster-down test-browser

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet -e ".[dev,kernels,tracking,hf]"
	touch $@

install: $(VENV)/.installed

run: install
	$(PY) -m toolkit.launch $(ARGS)

# The whole suite: the Slurm tests, then the `waits` tests, beside one two-worker queue of
# the tests that time nothing; then the timing tests alone (scripts/test_suite.py says why);
# with ARGS, one plain pytest with those arguments.
test: install
	$(PY) scripts/test_suite.py $(ARGS)

test-fast: install
	$(PY) -m pytest -m "not slow and not slurm" $(ARGS)

lint: install
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

# The local dev Slurm cluster (root, Debian-family): the Slurm tests bring it up themselves.
cluster-up:
	scripts/dev-cluster up

cluster-down:
	scripts/dev-cluster down

# Headless Chromium for the HTML-report test (root, Debian-family); the test installs it
# itself through the same script, and fails under CI=true when it cannot.
test-browser:
	scripts/install-test-browser
