# pybk: every target installs what it needs into .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: venv jar test test-fast image-test demo proto bench e2e clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[dev,spark,operator,local,bench,uvloop]'
	touch $(STAMP)

# Python processes keep their compiled modules (__pycache__, ignored by git): a test run starts hundreds of
# pybk processes, and compiling pybk afresh for each cost about a quarter of a second of CPU.
unexport PYTHONDONTWRITEBYTECODE

# a shuffled order every run (pytest-randomly prints its seed: SEED=N runs that order again)
ORDER := -p randomly $(if $(SEED),--randomly-seed=$(SEED))

# Four workers: the tests wait on processes, timers and deadlines much of their time, so two left the cores idle
# (10:59 on a fresh clone); four keep them busy. Tests that bound stalls in wall time run the threads they time in
# real time while they time them (tests/procfs.py `favoured`), so the neighbours this adds do not stretch them.
# pybk's Spark jar (its JVM log reader), built once before the workers start rather than by each of them;
# without a JDK it is not built and Spark scans of logs take the Python path
jar: venv
	@$(PY) -m pybk.spark.jvm > /dev/null || echo "pybk's Spark jar not built: Spark scans of logs take the Python path"

test: venv jar  # every test, on four workers (real etcd, bookies, Spark, the operator process), then the 25 slowest
	$(PY) -m pytest -q -p no:cacheprovider $(ORDER) -n 4 --dist loadgroup --durations=25 $(PYTEST_ARGS)

test-fast: venv  # the inner loop: only the tests that start no etcd, bookie, Spark or container process
	$(PY) -m pytest -q -p no:cacheprovider $(ORDER) -m "not processes" $(PYTEST_ARGS)

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
