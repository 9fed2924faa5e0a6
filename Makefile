# Two commands do all the set-up themselves on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tpukit-installed
EXTRAS ?= xla,profile,dev

# The torchtpu target's contract test runs against the real torch-tpu wheel, which needs a torch
# of its own (2.11-2.15): a second venv. torch 2.13.0+cpu is the CPU build (no CUDA wheels).
TPU_VENV ?= .venv-torchtpu
TPU_BIN := $(TPU_VENV)/bin
TPU_STAMP := $(TPU_VENV)/.tpukit-installed
TORCHTPU_PINS := torch==2.13.0+cpu torch-tpu==0.2.0 libtpu==0.0.52

.PHONY: install test test-torchtpu demo bench goldens clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-cache-dir --upgrade pip
	$(BIN)/python -m pip install -q --no-cache-dir -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile

$(TPU_STAMP): pyproject.toml
	test -x $(TPU_BIN)/python || $(PYTHON) -m venv $(TPU_VENV)
	$(TPU_BIN)/python -m pip install -q --no-cache-dir --upgrade pip
	$(TPU_BIN)/python -m pip install -q --no-cache-dir $(TORCHTPU_PINS) "pytest>=8"
	$(TPU_BIN)/python -m pip install -q --no-cache-dir -e .
	$(TPU_BIN)/python -c "import torch; assert torch.version.cuda is None, torch.__version__"
	touch $(TPU_STAMP)

# The torchtpu outputs against the real torch-tpu 0.2.0 (no TPU needed): TPUKIT_REQUIRE_TORCH_TPU
# makes a missing torch_tpu a failure, not a skip.
test-torchtpu: $(TPU_STAMP)
	TPUKIT_REQUIRE_TORCH_TPU=1 $(TPU_BIN)/python -m pytest -q tests/test_torchtpu_wheel.py

# Migrate a nanoGPT-style CUDA script into demo/, show the diff, run it on XLA:CPU, then run it
# again under `tpukit run` for the report.
demo: $(STAMP)
	rm -rf demo && mkdir -p demo
	cp fixtures/nanogpt_lite/cuda.py demo/train.py
	@echo "== tpukit migrate --diff demo/train.py"
	$(BIN)/tpukit migrate --diff --exit-zero demo/train.py
	@echo "== tpukit migrate demo/train.py"
	$(BIN)/tpukit migrate --exit-zero demo/train.py
	@echo "== PJRT_DEVICE=CPU python demo/train.py --steps 6   (XLA:CPU; a TPU VM runs it as is)"
	cd demo && PJRT_DEVICE=CPU ../$(BIN)/python train.py --steps 6
	@echo "== tpukit run demo/train.py --steps 6   (the same run, explained: compiles, fallbacks, host reads)"
	cd demo && PJRT_DEVICE=CPU ../$(BIN)/tpukit run train.py --steps 6

bench: $(STAMP)
	$(BIN)/python benchmarks/migrate_throughput.py

# After a rule change: rewrite fixtures/*/xla.py and findings.txt, then review the git diff.
goldens: $(STAMP)
	$(BIN)/python tests/update_goldens.py

clean:
	rm -rf demo .pytest_cache .hypothesis build dist *.egg-info
