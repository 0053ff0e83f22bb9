# The two commands of the README: `make quickstart` and `make test`. Both set up .venv first:
# the quickstart installs only what running a study needs; the tests add the dev extras.
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
JOBS ?= 2

.PHONY: quickstart test install corpus

# The user's report goes beside the results, runs/quickstart/reports/quickstart/ (git-ignored):
# the shipped reports/quickstart/ stays as committed and is compared with it (workbench diff; a
# difference beyond the tolerance is reported, and does not fail the target).
quickstart: $(VENV)/.installed-run
	$(BIN)/workbench run studies/quickstart.yaml --jobs $(JOBS)
	-$(BIN)/workbench diff reports/quickstart runs/quickstart/reports/quickstart

test: $(VENV)/.installed
	$(BIN)/python -m pytest -q -n 2

install: $(VENV)/.installed

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	touch $@

# pip compiles every installed file to bytecode on one core (about 40 s of CPU, mostly torch);
# installing with --no-compile and compiling on every core halves that wait on 2 cores. Files
# that do not compile on this Python (torch ships 3.12-only test helpers) are skipped, as pip
# skips them.
COMPILE = $(BIN)/python -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_path('purelib'), quiet=2, workers=0)"

# The package and its runtime dependencies only (no pytest, Ray, x-transformers).
$(VENV)/.installed-run: pyproject.toml constraints-dev.txt | $(VENV)/.created
	$(BIN)/python -m pip install -q --no-compile -c constraints-dev.txt -e .
	$(COMPILE)
	touch $@

# Everything the tests and benchmarks use; also satisfies the quickstart.
$(VENV)/.installed: pyproject.toml constraints-dev.txt | $(VENV)/.created
	$(BIN)/python -m pip install -q --no-compile -c constraints-dev.txt -e '.[dev]'
	$(COMPILE)
	touch $@ $(VENV)/.installed-run

# The 2026 table's text corpus (studies/corpora/debian_docs.py): three Debian documentation
# packages, then one JSON Lines file of their English documents. Needs root for apt-get.
corpus:
	apt-get install -y -qq linux-doc-6.1 python3.11-doc perl-doc
	$(PYTHON) studies/corpora/debian_docs.py
