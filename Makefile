# Two commands on a fresh machine:  `make demo` (the main job)  and  `make test` (the test suite).
# Both install what is missing first (scripts/setup.sh, idempotent).

PY ?= python3
# No data folder is needed: the envs fall back to the samples shipped in the package. A data root you
# export yourself (AGENTFLY_GYM_DATA=...) is passed through; `agentfly-gym data download NAME` gets full sets.

.PHONY: setup demo test
setup: .setup.stamp
.setup.stamp: pyproject.toml scripts/setup.sh
	PY=$(PY) bash scripts/setup.sh
	touch $@

# The main job: real Chess and ScienceWorld trajectories, concurrently, with the bundled CPU model;
# token-ID trajectories (Parquet + JSONL) and summary.json land in runs/demo.
demo: setup
	$(PY) -m agentfly_gym rollout --env Chess-v0 --env ScienceWorld-v0 --policy smollm2 \
	  -n 8 --group-size 2 --concurrency 8 --max-turns 4 --max-tokens 48 --output-dir runs/demo

# The tests: starts a Docker engine if none answers (scripts/docker-engine.sh), then pytest.
test: setup
	bash scripts/docker-engine.sh start
	$(PY) -m pytest
