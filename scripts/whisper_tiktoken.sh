#!/usr/bin/env bash
# openai-whisper's tokenizer (tiktoken + its vocabularies) in its own environment, the reference
# tests/unit/test_whisper_tokenizer.py judges the served tokenizers by:
#   scripts/whisper_tiktoken.sh script.py ARGS...   runs a script with that environment's python,
#                                                   WHISPER_ASSETS = the folder of the .tiktoken files
#                                                   and of openai-whisper's tokenizer.py (as text)
#   scripts/whisper_tiktoken.sh --install-only
# The lock requirements/whisper-tiktoken.txt is installed on first use into
# ${LORA_SERVING_CACHE:-~/.cache/lora-serving}/whisper-tiktoken, never into .venv. The assets come
# out of openai-whisper's sdist (checked against its sha256); openai-whisper is not installed (its
# package imports torch) and the served environment never sees either.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/peer_env.sh
source "$ROOT/scripts/peer_env.sh"
peer_env_install whisper-tiktoken "$ROOT/requirements/whisper-tiktoken.txt"
ENV_DIR=$PEER_ENV_DIR
SDIST=openai_whisper-20250625.tar.gz
SDIST_SHA256=37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96
ASSETS=$ENV_DIR/assets

if [[ ! -f "$ASSETS/multilingual.tiktoken" || ! -f "$ASSETS/tokenizer.py" ]]; then
  cache=${LORA_SERVING_CACHE:-$HOME/.cache/lora-serving}/wheels
  mkdir -p "$cache"
  if [[ ! -f "$cache/$SDIST" ]]; then
    echo "whisper-tiktoken: downloading $SDIST (its vocabularies only are used)" >&2
    python=${PYTHON:-python3.11}
    command -v "$python" >/dev/null || python=python3
    [[ -x "$ROOT/.venv/bin/python" ]] && python=$ROOT/.venv/bin/python
    "$python" -m pip --isolated download -q --no-deps --no-binary :all: \
      -d "$cache" openai-whisper==20250625 >&2
  fi
  echo "$SDIST_SHA256  $cache/$SDIST" | sha256sum --check --quiet
  tmp=$(mktemp -d)
  tar -xzf "$cache/$SDIST" -C "$tmp" --wildcards '*/whisper/assets/*.tiktoken' \
    '*/whisper/tokenizer.py'
  mkdir -p "$ASSETS"
  cp "$tmp"/openai_whisper-20250625/whisper/assets/{multilingual,gpt2}.tiktoken \
    "$tmp"/openai_whisper-20250625/whisper/tokenizer.py "$ASSETS/"
  rm -rf "$tmp"
fi

if [[ "${1:-}" == "--install-only" ]]; then
  "$ENV_DIR/bin/python" -c "import tiktoken; print('tiktoken', tiktoken.__version__)"
  ls "$ASSETS"
  exit 0
fi
WHISPER_ASSETS=$ASSETS exec "$ENV_DIR/bin/python" "$@"
