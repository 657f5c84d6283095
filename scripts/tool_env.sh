#!/usr/bin/env bash
# One cached tool environment: a pinned lock installed (--no-deps) into a virtual environment of
# its own, never .venv, once, and again only when the lock changes (a stamp file in it named
# after the lock's hash). The one helper behind every tool environment: the peers
# (scripts/peer_env.sh; lora_tools/bench/peer_env.py), the deploy linters
# (scripts/lint_deploy.sh) and the GPU environment (scripts/gpu_venv.sh).
#
#   scripts/tool_env.sh [options] NAME LOCK [EXTRA...]
#     --dir DIR      the environment's folder (default ${LORA_SERVING_CACHE:-~/.cache/lora-serving}/NAME)
#     --python PY    the interpreter, a command or a version uv finds (default $PYTHON or python3.11)
#     --quiet        the installer says nothing
#     --bytecode     compile the installed packages once (uv writes no bytecode, and with
#                    PYTHONDONTWRITEBYTECODE set every run of a tool compiled its imports again)
#     EXTRA          more requirements (pip's syntax: `-e .`, name==version) installed with
#                    --no-deps after the lock, before the stamp
# Prints the environment's folder on stdout; progress goes to stderr. uv is $UV, else .venv's;
# without either, venv + pip.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

dir="" python=${PYTHON:-python3.11} quiet=() bytecode=false
while [[ $# -gt 0 ]]; do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --quiet) quiet=(-q); shift ;;
    --bytecode) bytecode=true; shift ;;
    -*) echo "tool_env: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [[ $# -lt 2 ]]; then
  echo "usage: $0 [--dir DIR] [--python PY] [--quiet] [--bytecode] NAME LOCK [EXTRA...]" >&2
  exit 2
fi
name=$1 lock=$2
shift 2
dir=${dir:-${LORA_SERVING_CACHE:-$HOME/.cache/lora-serving}/$name}
stamp="$dir/.lock-$(sha256sum "$lock" | cut -c1-16)"

compile_once() {
  [[ $bytecode == true && ! -f "$dir/.bytecode" ]] || return 0
  "$dir/bin/python" -m compileall -q -j 0 \
    "$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >/dev/null 2>&1 || true  # a few packaged files are not Python 3.11 (templates): expected
  touch "$dir/.bytecode"
}

if [[ -f "$stamp" && -x "$dir/bin/python" ]]; then
  compile_once
  echo "$dir"
  exit 0
fi

echo "$name: installing $(grep -c '^[a-zA-Z]' "$lock" || true) pinned packages ($lock) into $dir" >&2
started=$SECONDS
rm -rf "$dir"
uv=${UV:-}
[[ -z "$uv" && -x "$root/.venv/bin/uv" ]] && uv=$root/.venv/bin/uv
if [[ -n "$uv" ]]; then
  interpreter=$(command -v "$python" || echo "$python")  # a version such as 3.12: uv finds it
  "$uv" venv -q --python "$interpreter" "$dir" >&2
  # not -q unless asked: uv reports what it downloads and installs
  "$uv" pip install "${quiet[@]}" --python "$dir/bin/python" --no-deps -r "$lock" >&2
  if [[ $# -gt 0 ]]; then
    "$uv" pip install "${quiet[@]}" --python "$dir/bin/python" --no-deps "$@" >&2
  fi
else
  command -v "$python" >/dev/null || python=python3
  "$python" -m venv "$dir" >&2
  pip=("$dir/bin/python" -m pip install "${quiet[@]}" --disable-pip-version-check --no-deps)
  "${pip[@]}" -r "$lock" >&2
  if [[ $# -gt 0 ]]; then
    "${pip[@]}" "$@" >&2
  fi
fi
touch "$stamp"
compile_once
echo "$name: installed in $((SECONDS - started)) s" >&2
echo "$dir"
