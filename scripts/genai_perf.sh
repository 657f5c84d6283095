#!/usr/bin/env bash
# genai-perf (NVIDIA's LLM benchmark client) against our Triton models:
#   scripts/genai_perf.sh profile -m qwen_vl_lora --endpoint-type kserve --backend vllm ...
#   scripts/genai_perf.sh --install-only
# The lock requirements/genai-perf.txt is installed on first use (and again when the lock
# changes) into its own virtual environment under ${LORA_SERVING_CACHE:-~/.cache/lora-serving},
# never into .venv (genai-perf wants numpy 2; Triton's Python backend needs numpy 1). genai-perf
# runs `perf_analyzer` from PATH: a wrapper there calls scripts/perf_analyzer (the 2.51 binary
# that setup lays out), so `make setup` must have run.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/peer_env.sh
source "$ROOT/scripts/peer_env.sh"
peer_env_install genai-perf "$ROOT/requirements/genai-perf.txt"
ENV_DIR=$PEER_ENV_DIR
if [[ ! -x "$ENV_DIR/wrapper-bin/perf_analyzer" ]]; then
  mkdir -p "$ENV_DIR/wrapper-bin"
  # shellcheck disable=SC2016  # expanded when the wrapper runs
  printf '#!/usr/bin/env bash\nexec "$LORA_SERVING_ROOT/scripts/perf_analyzer" "$@"\n' \
    >"$ENV_DIR/wrapper-bin/perf_analyzer"
  chmod +x "$ENV_DIR/wrapper-bin/perf_analyzer"
fi

if [[ "${1:-}" == "--install-only" ]]; then
  "$ENV_DIR/bin/genai-perf" --version
  exit 0
fi
export LORA_SERVING_ROOT=$ROOT
export PATH="$ENV_DIR/wrapper-bin:$ENV_DIR/bin:$PATH"
exec "$ENV_DIR/bin/genai-perf" "$@"
