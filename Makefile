# Entry points, each doing all set-up on a fresh machine: `make demo`, `make test`, `make fuzz`,
# `make reproduce` (ARGS=--quick for the two-minute version; the report goes to out/reproduce).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test fuzz bench reproduce clean

# `make fuzz`: examples of the CLI fuzzing suite (tests/test_fuzz_cli.py), random each run;
# about 1,100 a minute on a 2-core machine, so the default is some 10 to 15 minutes.
FUZZ_EXAMPLES ?= 15000

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, below 2.14: on this kind of machine that resolves to the CPU wheel on
	# disk instead of a multi-GB CUDA build; elsewhere pip takes what PyPI serves.
	$(PY) -m pip install --quiet "torch>=2.4,<2.14"
	# From here on that torch is pinned: no requirement of the runtimes may replace it.  Read
	# from its metadata: importing torch before numpy is installed warns "Failed to initialize NumPy".
	$(PY) -c 'from importlib.metadata import version; print("torch==" + version("torch"))' > $(VENV)/torch-pin.txt
	$(PY) -m pip install --quiet -c $(VENV)/torch-pin.txt "setuptools>=77"
	# The test set and the runtimes the export tests run (pyproject.toml's `runtimes`).
	# No build isolation: DeepSpeed's sdist imports torch while it builds, and an isolated
	# build environment would download a torch of its own.
	$(PY) -m pip install --quiet --no-build-isolation -c $(VENV)/torch-pin.txt -e ".[test,runtimes]"
	# torchtitan's previous release (0.2), beside the current one, for the tests of its export
	$(PY) -m pip install --quiet --no-deps --upgrade --target $(VENV)/torchtitan-0.2 "torchtitan==0.2.2"
	touch $(STAMP)

demo: $(STAMP)
	bash examples/demo.sh $(VENV)/bin/pipeplan

# `make test`: the suite on TEST_WORKERS processes (pytest-xdist), each test file whole on one of
# them, so that a file's module-scoped fixtures (its shared multi-process runs) are built once.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

fuzz: $(STAMP)
	PIPEPLAN_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest tests/test_fuzz_cli.py -q -p no:cacheprovider --hypothesis-show-statistics

reproduce: $(STAMP)
	mkdir -p out
	$(VENV)/bin/pipeplan reproduce -o out/reproduce $(ARGS)

bench: $(STAMP)
	$(PY) experiments/bench_simulator.py

clean:
	rm -rf $(VENV) out
