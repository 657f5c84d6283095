#!/usr/bin/env bash
# The official OpenAI Python SDK in its own environment (tests/e2e/test_openai_api.py):
#   scripts/openai_sdk.sh client.py ARGS...   runs a script with that environment's python
#   scripts/openai_sdk.sh --install-only
# The lock requirements/openai-sdk.txt is installed on first use (and again when the lock
# changes) into ${LORA_SERVING_CACHE:-~/.cache/lora-serving}/openai-sdk, never into .venv, so
# the SDK talks to lora-openai exactly as from a user's own environment.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOCK=$ROOT/requirements/openai-sdk.txt
CACHE=${LORA_SERVING_CACHE:-$HOME/.cache/lora-serving}
ENV_DIR=$CACHE/openai-sdk

install() {
  local stamp
  stamp="$ENV_DIR/.lock-$(sha256sum "$LOCK" | cut -c1-16)"
  [[ -f "$stamp" ]] && return 0
  echo "openai_sdk: installing $LOCK into $ENV_DIR" >&2
  local started=$SECONDS
  rm -rf "$ENV_DIR"
  local python=${PYTHON:-python3.11}
  command -v "$python" >/dev/null || python=python3
  if [[ -x "$ROOT/.venv/bin/uv" ]]; then
    "$ROOT/.venv/bin/uv" venv -q --python "$(command -v "$python")" "$ENV_DIR"
    "$ROOT/.venv/bin/uv" pip install --python "$ENV_DIR/bin/python" --no-deps -r "$LOCK" >&2
  else
    "$python" -m venv "$ENV_DIR"
    "$ENV_DIR/bin/python" -m pip install --disable-pip-version-check --no-deps -r "$LOCK" >&2
  fi
  touch "$stamp"
  echo "openai_sdk: installed in $((SECONDS - started)) s" >&2
}

install
if [[ "${1:-}" == "--install-only" ]]; then
  "$ENV_DIR/bin/python" -c "import openai; print('openai', openai.__version__)"
  exit 0
fi
exec "$ENV_DIR/bin/python" "$@"
