#!/usr/bin/env bash
# One-command, idempotent set-up of the CPU serving stack (see docs/models-serving.md, "What `make setup` does").
# Each step prints [n/N] and skips itself when its result is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
VENV=$ROOT/.venv
TRITON_DIR=$ROOT/.triton
WHEEL_CACHE=${LORA_SERVING_CACHE:-$HOME/.cache/lora-serving}/wheels
UV_VERSION=0.13.9
PYTRITON_WHEEL=nvidia-pytriton==0.7.0            # carries tritonserver 2.51.0 + Python backend
PERF_ANALYZER_WHEEL=tritonclient==2.51.0         # the perf_analyzer binary that runs on glibc 2.36
CUDART_WHEEL=nvidia-cuda-runtime-cu12==12.9.79   # libcudart.so.12, which perf_analyzer links
STEPS=6
step() { echo; echo "==> [$1/$STEPS] $2"; }
t0=$(date +%s)

step 1 "system packages (espeak-ng, sox, libb64)"
missing=()
for pkg in espeak-ng sox libsox-fmt-all libb64-0d; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
else
  echo "already installed"
fi

step 2 "Python environment in .venv (vLLM CPU build, torch, tritonclient, ...; ~3 GB the first time)"
if [ ! -x "$VENV/bin/python" ]; then
  # Triton's Python backend stub embeds libpython: the venv must come from a shared-library build.
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
# requirements/cpu.txt is a complete lock (uv pip compile with requirements/overrides.txt), so
# --no-deps installs exactly it: the deliberate overrides (numpy<2, torch build) stay in force.
"$VENV/bin/uv" pip install --python "$VENV/bin/python" --no-deps -r requirements/cpu.txt
"$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --no-deps -e .
# uv writes no bytecode, and with PYTHONDONTWRITEBYTECODE set (this machine, CI) Python never
# caches any: every process compiled vLLM, torch, ... from source on each start, and a module
# first imported mid-request (anyio's backend, in the OpenAI front) held that request back for
# seconds. Compile site-packages (~20 s the first time; seconds when done). A few packaged files
# are not Python 3.11 (templates, Python 2 leftovers): their errors are expected.
echo "bytecode for .venv"
"$VENV/bin/python" -m compileall -q -j 0 \
  "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  >/dev/null 2>&1 || true

fetch_wheel() {  # fetch_wheel SPEC -> path of the cached wheel
  mkdir -p "$WHEEL_CACHE"
  local name=${1%%==*} version=${1##*==}
  local found
  found=$(ls "$WHEEL_CACHE"/"${name//-/_}"-"$version"-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$found" ]; then
    "$VENV/bin/python" -m pip --isolated download -q --no-deps \
      --only-binary=:all: -d "$WHEEL_CACHE" "$1" >&2
    found=$(ls "$WHEEL_CACHE"/"${name//-/_}"-"$version"-*.whl | head -n 1)
  fi
  echo "$found"
}

step 3 "Triton Inference Server 2.51 + Python backend (from the $PYTRITON_WHEEL wheel)"
if [ ! -x "$TRITON_DIR/bin/tritonserver" ]; then
  wheel=$(fetch_wheel "$PYTRITON_WHEEL")
  tmp=$(mktemp -d)
  "$VENV/bin/python" -m zipfile -e "$wheel" "$tmp"
  rm -rf "$TRITON_DIR" && mkdir -p "$TRITON_DIR"
  cp -r "$tmp/pytriton/tritonserver/bin" "$tmp/pytriton/tritonserver/backends" \
        "$tmp/pytriton/tritonserver/caches" "$TRITON_DIR/"
  cp -r "$tmp/nvidia_pytriton.libs" "$TRITON_DIR/lib"
  cp "$tmp/pytriton/tritonserver/python_backend_stubs/3.11/triton_python_backend_stub" \
     "$TRITON_DIR/backends/python/"
  chmod +x "$TRITON_DIR/bin/tritonserver" "$TRITON_DIR/backends/python/triton_python_backend_stub"
  rm -rf "$tmp"
fi
echo "tritonserver: $TRITON_DIR/bin/tritonserver"

step 4 "perf_analyzer (from the $PERF_ANALYZER_WHEEL wheel; kept apart from the imported client)"
if [ ! -x "$TRITON_DIR/perf/perf_analyzer" ]; then
  mkdir -p "$TRITON_DIR/perf/lib"
  tmp=$(mktemp -d)
  "$VENV/bin/python" -m zipfile -e "$(fetch_wheel "$PERF_ANALYZER_WHEEL")" "$tmp"
  cp "$tmp"/tritonclient-*.data/data/bin/perf_analyzer "$TRITON_DIR/perf/"
  "$VENV/bin/python" -m zipfile -e "$(fetch_wheel "$CUDART_WHEEL")" "$tmp/cudart"
  cp "$tmp"/cudart/nvidia/cuda_runtime/lib/libcudart.so.12 "$TRITON_DIR/perf/lib/"
  chmod +x "$TRITON_DIR/perf/perf_analyzer"
  rm -rf "$tmp"
fi
"$ROOT/scripts/perf_analyzer" --version | head -n 1

step 5 "demo models and adapters in demo_models/ (built locally, no model hub)"
"$VENV/bin/python" -m lora_tools.demo build "$ROOT/demo_models"

step 6 "moto's S3-API server for the object-storage adapter tests (its own environment, not .venv)"
"$ROOT/scripts/s3_server.sh" --install-only

echo
echo "setup done in $(( $(date +%s) - t0 )) s"
