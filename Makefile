# Two commands on a fresh machine:  `make demo` (the main job)  and  `make test` (the test suite).
# Both install what is missing first (scripts/setup.sh: system packages, then the locked Python packages
# into the virtual environment .venv; skipped when that environment is already set up from this lock).

VENV ?= .venv
PY ?= $(VENV)/bin/python
# No data folder is needed: the envs fall back to the samples shipped in the package. A data root you
# export yourself (AGENTFLY_GYM_DATA=...) is passed through; `agentfly-gym data download NAME` gets full sets.

.PHONY: setup demo test test-fast lint lock docs
# No stamp file here: setup.sh keeps its stamp inside the environment it set up, so `PY=<another python>`
# sets that one up instead of trusting a marker left by another interpreter.
setup:
	@VENV=$(VENV) PY=$(PY) bash scripts/setup.sh

# The main job: real Chess and ScienceWorld trajectories, concurrently, with the bundled CPU model;
# token-ID trajectories (Parquet + JSONL) and summary.json land in runs/demo.
demo: setup
	$(PY) -m agentfly_gym rollout --env Chess-v0 --env ScienceWorld-v0 --policy smollm2 \
	  -n 8 --group-size 2 --concurrency 8 --max-turns 4 --max-tokens 48 --output-dir runs/demo --overwrite

# The tests: starts a Docker engine if none answers (scripts/docker-engine.sh), then pytest.
# PYTEST_ARGS passes arguments on to pytest: make test PYTEST_ARGS="tests/test_cli.py -k append" (empty by
# default, so a plain `make test`, which CI runs, is the whole suite).
# The tests run in parallel, one worker per CPU (pytest-xdist; tests that must not run beside each other share an
# xdist_group mark, kept on one worker by --dist loadgroup), and in a random order (pytest-randomly; the seed is
# printed at the top of the run).  TEST_WORKERS=0 runs them in this process; TEST_SEED=N replays the order of
# seed N (with TEST_WORKERS=0 exactly, with workers each worker's share in that order).
PYTEST_ARGS ?=
TEST_WORKERS ?= auto
TEST_SEED ?=
PYTEST_RUN = $(PY) -m pytest -p randomly -n $(TEST_WORKERS) --dist loadgroup $(if $(TEST_SEED),--randomly-seed=$(TEST_SEED))
test: setup
	bash scripts/docker-engine.sh start
	$(PYTEST_RUN) $(PYTEST_ARGS)

# The quick check while working: every module's core tests, without those marked slow (over a few seconds
# each on a 2-core machine); under 5 minutes on 2 cores.  `make test` (and CI) still runs everything.
test-fast: setup
	bash scripts/docker-engine.sh start
	$(PYTEST_RUN) -m "not slow" $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, docs/): built into site/ with --strict, so a broken link, a missing page or
# an unresolved API reference fails; `$(PY) -m mkdocs serve` previews it while you edit.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# Lint: ruff with the rules in pyproject.toml ([tool.ruff]); CI runs it before the tests.
lint: setup
	$(PY) -m ruff check .

# Regenerate requirements/lock.txt after changing pyproject.toml's dependencies (UPGRADE=1 moves every pin).
lock:
	@UV=$$(command -v uv || echo $(VENV)/bin/uv) bash scripts/lock.sh
