# Two commands do everything on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test docs bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip

# torch first: the pinned CPU wheel lies on the build machines' disk; an unpinned torch pulls a CUDA build.
$(STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e ".[test,wandb,hf,bench,docs]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	WANDB_MODE=offline $(BIN)/lightning-xai fit --config examples/configs/sst2.yaml

# The import contracts of setup.cfg (one direction of imports, no circles), the suite, then the docstring examples
# of the package (every public example must run).
test: $(STAMP)
	$(BIN)/lint-imports --no-cache
	WANDB_MODE=offline WANDB_SILENT=true $(BIN)/python -m pytest -q --durations=15 tests
	WANDB_MODE=offline WANDB_SILENT=true $(BIN)/python -m pytest -q --doctest-modules lightning_xai
	$(MAKE) docs

# The documentation site (mkdocs.yml), warnings as errors: a docstring mkdocstrings cannot read, a broken link or a
# public name without a page fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf runs lightning_logs wandb .pytest_cache site
