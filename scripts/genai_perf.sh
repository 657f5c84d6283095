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
LOCK=$ROOT/requirements/genai-perf.txt
CACHE=${LORA_SERVING_CACHE:-$HOME/.cache/lora-serving}
ENV_DIR=$CACHE/genai-perf

install() {
  local stamp
  stamp="$ENV_DIR/.lock-$(sha256sum "$LOCK" | cut -c1-16)"
  [[ -f "$stamp" ]] && return 0
  local count
  count=$(grep -c '^[a-zA-Z]' "$LOCK")
  echo "genai_perf: installing genai-perf and $((count - 1)) pinned dependencies ($LOCK) into $ENV_DIR" >&2
  local started=$SECONDS
  rm -rf "$ENV_DIR"
  local python=${PYTHON:-python3.11}
  command -v "$python" >/dev/null || python=python3
  if [[ -x "$ROOT/.venv/bin/uv" ]]; then
    "$ROOT/.venv/bin/uv" venv -q --python "$(command -v "$python")" "$ENV_DIR"
    # not -q: uv reports what it downloads and installs
    "$ROOT/.venv/bin/uv" pip install --python "$ENV_DIR/bin/python" --no-deps -r "$LOCK" >&2
  else
    "$python" -m venv "$ENV_DIR"
    "$ENV_DIR/bin/python" -m pip install --disable-pip-version-check --no-deps -r "$LOCK" >&2
  fi
  mkdir -p "$ENV_DIR/wrapper-bin"
  # shellcheck disable=SC2016  # expanded when the wrapper runs
  printf '#!/usr/bin/env bash\nexec "$LORA_SERVING_ROOT/scripts/perf_analyzer" "$@"\n' \
    >"$ENV_DIR/wrapper-bin/perf_analyzer"
  chmod +x "$ENV_DIR/wrapper-bin/perf_analyzer"
  touch "$stamp"
  echo "genai_perf: installed in $((SECONDS - started)) s" >&2
}

install
if [[ "${1:-}" == "--install-only" ]]; then
  "$ENV_DIR/bin/genai-perf" --version
  exit 0
fi
export LORA_SERVING_ROOT=$ROOT
export PATH="$ENV_DIR/wrapper-bin:$ENV_DIR/bin:$PATH"
exec "$ENV_DIR/bin/genai-perf" "$@"
