#!/usr/bin/env bash
# The official OpenAI Python SDK in its own environment (tests/e2e/test_openai_api.py):
#   scripts/openai_sdk.sh client.py ARGS...   runs a script with that environment's python
#   scripts/openai_sdk.sh --install-only
# The lock requirements/openai-sdk.txt is installed on first use (and again when the lock
# changes) into ${LORA_SERVING_CACHE:-~/.cache/lora-serving}/openai-sdk, never into .venv, so
# the SDK talks to lora-openai exactly as from a user's own environment.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/peer_env.sh
source "$ROOT/scripts/peer_env.sh"
peer_env_install openai-sdk "$ROOT/requirements/openai-sdk.txt"
ENV_DIR=$PEER_ENV_DIR

if [[ "${1:-}" == "--install-only" ]]; then
  "$ENV_DIR/bin/python" -c "import openai; print('openai', openai.__version__)"
  exit 0
fi
exec "$ENV_DIR/bin/python" "$@"
