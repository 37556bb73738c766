# pybk: every target installs what it needs into .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: venv test image-test demo proto bench e2e clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[dev,spark,operator,local,bench,uvloop]'
	touch $(STAMP)

test: venv
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

image-test: venv  # root + apt-get: builds the image with podman and runs it (docs/kubernetes.md); else says why, exit 0
	$(PY) bookie_image/image_test.py

demo: venv  # DEMO_ARGS=--secure runs it on a secured cluster (TLS, etcd auth, tokens)
	$(PY) -m pybk.demo $(DEMO_ARGS)

proto: venv
	$(PY) -m pybk.proto.generate

e2e: venv  # needs a Kubernetes cluster in KUBECONFIG with the pybk image loaded: see e2e/README.md
	$(PY) -m pytest -v -p no:cacheprovider e2e/

bench: venv
	$(VENV)/bin/pybk bench bookie

clean:
	rm -rf $(VENV) build *.egg-info
