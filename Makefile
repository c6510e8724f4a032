# Everything runs in a local virtual environment made from python3 and pip alone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-backends demo bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch==2.13.0 (CPU) is the independent reference for the fidelity tests;
	# JAX for the backend tests; tf2onnx + onnxruntime for the ONNX export tests.
	$(PY) -m pip install --quiet -e ".[test,reference,backends,onnx]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(PY) -m keras_vit.cli demo

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) benchmarks/bench.py --quick

clean:
	rm -rf $(VENV) build *.egg-info
