#!/usr/bin/env bash
# Sourced by the scripts that run a peer tool from a lock of its own (genai_perf.sh,
# openai_sdk.sh, whisper_tiktoken.sh, openai_whisper.sh): `peer_env_install NAME LOCK` installs
# LOCK on first use, and again when the lock changes, into
# ${LORA_SERVING_CACHE:-~/.cache/lora-serving}/NAME, never into .venv, compiled to bytecode
# (scripts/tool_env.sh, the one helper for tool environments), and sets PEER_ENV_DIR. Needs ROOT
# (the repository) set by the caller.

peer_env_install() {
  # shellcheck disable=SC2034  # read by the script that sources this one
  PEER_ENV_DIR=$("$ROOT/scripts/tool_env.sh" --bytecode "$1" "$2")
}
