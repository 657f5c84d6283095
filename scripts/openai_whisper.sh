#!/usr/bin/env bash
# openai-whisper (PyPI, CPU torch) in its own environment: the reference for word-level timestamps
# and subtitle writing that tests/openai_whisper/ and the word-timestamp tests run.
#   scripts/openai_whisper.sh script.py ARGS...   runs a script with that environment's python
#   scripts/openai_whisper.sh --install-only
# The lock requirements/openai-whisper.txt is installed on first use (and again when it changes)
# into ${LORA_SERVING_CACHE:-~/.cache/lora-serving}/openai-whisper, never into .venv. Its torch is
# the CPU build (2.13.0+cpu), found in TORCH_CPU_FIND_LINKS: this machine's wheel folder when it
# holds it, else PyTorch's CPU index. openai-whisper's load_audio needs an ffmpeg binary: callers
# hand it 16 kHz float32 arrays instead.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [[ -z "${TORCH_CPU_FIND_LINKS:-}" ]]; then
  if compgen -G "/opt/wheels/torch-2.13.0+cpu-*.whl" >/dev/null; then
    TORCH_CPU_FIND_LINKS=/opt/wheels
  else
    TORCH_CPU_FIND_LINKS=https://download.pytorch.org/whl/cpu/torch/
  fi
fi
export UV_FIND_LINKS=$TORCH_CPU_FIND_LINKS PIP_FIND_LINKS=$TORCH_CPU_FIND_LINKS
# shellcheck source=scripts/peer_env.sh
source "$ROOT/scripts/peer_env.sh"
peer_env_install openai-whisper "$ROOT/requirements/openai-whisper.txt"

if [[ "${1:-}" == "--install-only" ]]; then
  "$PEER_ENV_DIR/bin/python" -c "import torch, whisper; print('openai-whisper', whisper.__version__, 'torch', torch.__version__)"
  exit 0
fi
# One thread each: the reference runs beside a server on a small machine.
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} exec "$PEER_ENV_DIR/bin/python" "$@"
