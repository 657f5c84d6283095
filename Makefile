# The two commands a user needs: `make serve` and `make test` (both run `make setup` first).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002

.PHONY: setup serve test test-unit lint lock clean-models gpu-check

# Idempotent: a finished step takes a second or two, so the other targets always run it.
setup:
	@bash scripts/setup.sh

serve: setup
	@$(PY) -m lora_serving.launcher --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) \
		--metrics-port $(METRICS_PORT)

# The whole suite: unit tests, engine tests and end-to-end tests through one real tritonserver.
test: setup
	@$(PY) -m pytest tests/unit tests/engine tests/e2e -ra

test-unit: setup
	@$(PY) -m pytest tests/unit -q

lint: setup
	@$(VENV)/bin/ruff check src tests client model_repository
	@$(VENV)/bin/ruff format --check src tests client model_repository

# On a CUDA machine with vLLM 0.32 (CUDA build): the Whisper LoRA fidelity matrix on the GPU.
# Not part of `make test` (CI has no GPU).
gpu-check:
	@bash scripts/gpu_check.sh

# Recompile the pinned lock after editing requirements/cpu.in or requirements/overrides.txt.
lock: setup
	@$(VENV)/bin/uv pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		requirements/cpu.in --override requirements/overrides.txt -o requirements/cpu.txt

clean-models:
	rm -rf demo_models
