# Two entry points (README): `make test` and `make gate`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# On the CPU machines the CPU build of torch 2.13.0 lies on disk and pip takes it; on a GPU
# runner the same spec pulls the CUDA build. Override with TORCH_SPEC=... if needed.
TORCH_SPEC ?= torch==2.13.0
# Test processes (pytest-xdist): 2 fit the 2-core CI machine; 0 runs the suite in one process.
# The GPU tests stay in one of them (conftest: one xdist group), since they share the device.
TEST_WORKERS ?= 2

.PHONY: setup test gate lint clean mutants

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[dev]"
	touch $@

lint: setup
	$(VENV)/bin/ruff check .

test: setup lint
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadgroup

gate: setup
	$(VENV)/bin/csagate run --ratio 128

# Every ignored output (.gitignore) except the inputs kept on purpose: .dsl/, .whl/, out/.
clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info build dist .csagate-cache
	find . -path ./.dsl -prune -o -path ./.whl -prune -o \( -name __pycache__ -o -name '*.pyc' \) \
		-prune -exec rm -rf {} +

# The mutation self-test (GPU): each catalogued bug must make `csagate run` fail (docs/MUTANTS.md).
mutants: setup
	$(PY) mutants/run.py gate --report out/MUTANTS_gate.md
