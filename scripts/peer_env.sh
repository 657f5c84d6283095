#!/usr/bin/env bash
# Sourced by the scripts that run a peer tool from a lock of its own (genai_perf.sh,
# openai_sdk.sh): `peer_env_install NAME LOCK` installs LOCK on first use, and again when the
# lock changes, into ${LORA_SERVING_CACHE:-~/.cache/lora-serving}/NAME, never into .venv, and
# sets PEER_ENV_DIR. Needs ROOT (the repository) set by the caller.

peer_env_install() {
  local name=$1 lock=$2
  local cache=${LORA_SERVING_CACHE:-$HOME/.cache/lora-serving}
  PEER_ENV_DIR=$cache/$name
  local stamp
  stamp="$PEER_ENV_DIR/.lock-$(sha256sum "$lock" | cut -c1-16)"
  if [[ -f "$stamp" ]]; then
    peer_env_compile
    return 0
  fi
  local count
  count=$(grep -c '^[a-zA-Z]' "$lock")
  echo "$name: installing $count pinned packages ($lock) into $PEER_ENV_DIR" >&2
  local started=$SECONDS
  rm -rf "$PEER_ENV_DIR"
  local python=${PYTHON:-python3.11}
  command -v "$python" >/dev/null || python=python3
  if [[ -x "$ROOT/.venv/bin/uv" ]]; then
    "$ROOT/.venv/bin/uv" venv -q --python "$(command -v "$python")" "$PEER_ENV_DIR"
    # not -q: uv reports what it downloads and installs
    "$ROOT/.venv/bin/uv" pip install --python "$PEER_ENV_DIR/bin/python" --no-deps -r "$lock" >&2
  else
    "$python" -m venv "$PEER_ENV_DIR"
    "$PEER_ENV_DIR/bin/python" -m pip install --disable-pip-version-check --no-deps -r "$lock" >&2
  fi
  touch "$stamp"
  peer_env_compile
  echo "$name: installed in $((SECONDS - started)) s" >&2
}

# Bytecode once per environment: uv writes none, and with PYTHONDONTWRITEBYTECODE set Python
# never caches any, so every run of the tool compiled its imports (openai, pydantic, ...) again.
peer_env_compile() {
  [[ -f "$PEER_ENV_DIR/.bytecode" ]] && return 0
  "$PEER_ENV_DIR/bin/python" -m compileall -q -j 0 \
    "$("$PEER_ENV_DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >/dev/null 2>&1 || true  # a few packaged files are not Python 3.11 (templates): expected
  touch "$PEER_ENV_DIR/.bytecode"
}
