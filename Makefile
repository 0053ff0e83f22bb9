# The two commands of the README: `make quickstart` and `make test`. Both set up .venv first:
# the quickstart installs only what running a study needs; the tests add the dev extras.
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
JOBS ?= 2

.PHONY: quickstart test install

quickstart: $(VENV)/.installed-run
	$(BIN)/workbench run studies/quickstart.yaml --jobs $(JOBS)

test: $(VENV)/.installed
	$(BIN)/python -m pytest -q -n 2

install: $(VENV)/.installed

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	touch $@

# The package and its runtime dependencies only (no pytest, Ray, x-transformers).
$(VENV)/.installed-run: pyproject.toml constraints-dev.txt | $(VENV)/.created
	$(BIN)/python -m pip install -q -c constraints-dev.txt -e .
	touch $@

# Everything the tests and benchmarks use; also satisfies the quickstart.
$(VENV)/.installed: pyproject.toml constraints-dev.txt | $(VENV)/.created
	$(BIN)/python -m pip install -q -c constraints-dev.txt -e '.[dev]'
	touch $@ $(VENV)/.installed-run
