VENV := .venv
PY := $(VENV)/bin/python
# The project supports CPython 3.11 only (requires-python); fall back to python3 if it is 3.11.
PYTHON ?= $(shell command -v python3.11 || command -v python3)

.PHONY: install up test bench lint clean

install: $(VENV)/.installed

# Re-runs only when the dependency declarations change; the package itself is editable.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $@

up: install
	$(VENV)/bin/mqlake up

test: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

bench: install
	$(PY) -m benchmarks

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build dist *.egg-info .mqlake .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
