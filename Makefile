# Everything runs in a local virtual environment made from python3 and pip alone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Two workers: the suite's processes are mostly single-threaded TensorFlow on
# small models, so two cores run two of them. --dist loadfile: a file's tests run
# on one worker, so a module fixture (a trained run, its exports) is built once
# per run, and a file's clusters never overlap each other. (Not loadgroup: with
# pytest 9 xdist 3.8's groups are silently ignored, as it renames item._nodeid
# while pytest reads item._id.) --no-loadscope-reorder: files are handed out in collection order,
# which tests/conftest.py sets longest first (LONGEST_FIRST), so no long file starts last.
WORKERS ?= 2
XDIST := -n $(WORKERS) --dist loadfile --no-loadscope-reorder
# One TensorFlow compute thread per test process: two workers (and the processes they start)
# already fill two cores, and each process's own pool of two threads only made them wait on
# each other (a 5-9% longer run in two A/B runs on this machine). Computation is unchanged:
# every comparison in the suite is between runs under the same setting.
THREADS := TF_NUM_INTRAOP_THREADS=1 OMP_NUM_THREADS=1

.PHONY: install test test-fast demo bench bench-check clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# A venv made before the rename holds this checkout as "keras-vit": drop it so
	# the two names do not share (and later remove) the keras-vit command.
	$(PY) -m pip uninstall --quiet --yes keras-vit 2>/dev/null || true
	# all: every optional feature the tests exercise; test: pytest, xdist and
	# the independent references (scipy, scikit-learn); docs: mkdocs build --strict;
	# reference: torch==2.13.0 (CPU) and transformers for the fidelity tests;
	# backends: JAX for the backend tests.
	$(PY) -m pip install --quiet -e ".[all,test,docs,reference,backends]"
	touch $(STAMP)

install: $(STAMP)

# Everything, slow tests included (CI: .ci/run), with line and branch coverage of
# keras_vit (subprocesses too: setup.cfg's [coverage:run]) held to the floor in
# setup.cfg's fail_under, and the 25 slowest tests, so every run shows where the time goes.
COVERAGE := --cov=keras_vit --cov-report=term:skip-covered
test: $(STAMP)
	rm -f .coverage .coverage.*
	$(THREADS) $(PY) -m pytest -q $(XDIST) --durations=25 $(COVERAGE)

# The edit-test loop: everything not marked slow, then a check that it exercised
# every keras_vit module (tests/touched_modules.py reads its coverage, of lines alone:
# tests/coverage-fast.cfg; the floor of setup.cfg is for the whole suite, so it is off here).
test-fast: $(STAMP)
	rm -f .coverage .coverage.* .coverage-fast.json
	$(THREADS) $(PY) -m pytest -q $(XDIST) -m "not slow" --durations=10 --cov=keras_vit --cov-config=tests/coverage-fast.cfg --cov-report=json:.coverage-fast.json --cov-fail-under=0
	$(PY) tests/touched_modules.py .coverage-fast.json

demo: $(STAMP)
	$(PY) -m keras_vit_cli demo

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) benchmarks/bench.py --quick

# The speed guard, not part of `make test`: the trainer against Keras `fit` (of the same model and
# of keras-hub's) and inference against keras-hub, paired per round; fails below 0.97x.
bench-check: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) benchmarks/check.py

clean:
	rm -rf $(VENV) build *.egg-info
