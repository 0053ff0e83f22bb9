# The two commands of the README: `make quickstart` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
JOBS ?= 2

.PHONY: quickstart test install

quickstart: $(VENV)/.installed
	$(BIN)/workbench run studies/quickstart.yaml --jobs $(JOBS)

test: $(VENV)/.installed
	$(BIN)/python -m pytest -q -n 2

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints-dev.txt -e '.[dev]'
	touch $@
