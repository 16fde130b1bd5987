# BlackwellSparseK developer targets. Everything goes through the package; see README.md.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
# torch first and pinned: 2.13.0 resolves to the CPU wheel on local disk here, so no CUDA packages are pulled.
# On a GPU machine with a CUDA build of torch already installed: make install TORCH=
TORCH ?= torch==2.13.0
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
ARGS ?=
PYTEST_ARGS ?=

.PHONY: install demo test test-real-compile build-all wheel clean compare-88 bench profile

install:
ifneq ($(strip $(TORCH)),)
	$(PIP) install "$(TORCH)"
endif
	$(PIP) install -e ".[test]"

# The main job end to end: install, generate and build a kernel, run sparse attention on a few layouts and check
# it against the float64 reference (on the GPU when there is an H100/H200, else on the CPU fallback; it says which).
demo: install
	$(PYTHON) examples/quickstart.py

test:
	$(PYTHON) -m pytest -q tests $(PYTEST_ARGS)

# Only the real nvcc compiles of generated kernels (slow; no GPU needed).
test-real-compile:
	$(PYTHON) -m pytest -q tests -k real_compile -s $(PYTEST_ARGS)

# Compile every config in cutlass_configs/ into the kernel cache, JOBS nvcc at a time.
build-all:
	$(PYTHON) -m blackwell_sparsek build --all -j $(JOBS)

wheel:
	$(PIP) wheel . --no-deps -w dist

# Build outputs of the repo only; the kernel cache is cleared with: python -m blackwell_sparsek cache clear
clean:
	rm -rf build dist .pytest_cache *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

compare-88 bench profile:
	$(PYTHON) -m blackwell_sparsek $@ $(ARGS)
