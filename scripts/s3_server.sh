#!/usr/bin/env bash
# moto's standalone S3-API server in its own environment (tests/s3_server.py starts it for the
# object-storage adapter tests):
#   scripts/s3_server.sh -H 127.0.0.1 -p PORT   runs moto_server
#   scripts/s3_server.sh --install-only         installs it (make setup does this)
# The lock requirements/moto-server.txt is installed on first use (and again when the lock
# changes) into ${LORA_SERVING_CACHE:-~/.cache/lora-serving}/moto-server, never into .venv:
# the product talks to it over HTTP as it would to AWS S3 or MinIO.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/peer_env.sh
source "$ROOT/scripts/peer_env.sh"
peer_env_install moto-server "$ROOT/requirements/moto-server.txt"
ENV_DIR=$PEER_ENV_DIR

if [[ "${1:-}" == "--install-only" ]]; then
  "$ENV_DIR/bin/python" -c "import moto; print('moto', moto.__version__)"
  exit 0
fi
exec "$ENV_DIR/bin/moto_server" "$@"
