# Two commands do all the set-up themselves on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tpukit-installed
EXTRAS ?= xla,profile,dev

.PHONY: install test demo bench goldens clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-cache-dir --upgrade pip
	$(BIN)/python -m pip install -q --no-cache-dir -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile

# Migrate a nanoGPT-style CUDA script into demo/, show the diff, run it on XLA:CPU.
demo: $(STAMP)
	rm -rf demo && mkdir -p demo
	cp fixtures/nanogpt_lite/cuda.py demo/train.py
	@echo "== tpukit migrate --diff demo/train.py"
	$(BIN)/tpukit migrate --diff --exit-zero demo/train.py
	@echo "== tpukit migrate demo/train.py"
	$(BIN)/tpukit migrate --exit-zero demo/train.py
	@echo "== PJRT_DEVICE=CPU python demo/train.py --steps 6   (XLA:CPU; a TPU VM runs it as is)"
	cd demo && PJRT_DEVICE=CPU ../$(BIN)/python train.py --steps 6

bench: $(STAMP)
	$(BIN)/python benchmarks/migrate_throughput.py

# After a rule change: rewrite fixtures/*/xla.py and findings.txt, then review the git diff.
goldens: $(STAMP)
	$(BIN)/python tests/update_goldens.py

clean:
	rm -rf demo .pytest_cache .hypothesis build dist *.egg-info
