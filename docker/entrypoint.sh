#!/usr/bin/env bash
# Starts tritonserver in the GPU image on the model repository, with the options these models
# need. Arguments are passed on to tritonserver (e.g. --log-verbose=1). Environment:
#   MODEL_REPOSITORY       the model repository (default /models, baked in from model_repository_gpu/)
#   TRITON_MODEL_CONTROL   none (default): the models load at start and cannot be changed;
#                          explicit: they can be reloaded through Triton's repository API
#                          (POST /v2/repository/models/<name>/load), e.g. after editing an
#                          adapter list. That API runs code from the repository: set
#                          TRITON_ADMIN_KEY so it needs the header `admin-key: <key>`.
#   TRITON_ADMIN_KEY       see above (explicit mode only)
#   TRITON_LOAD_THREADS    models loaded at once (default 1, see below)
#   TRITON_EXIT_TIMEOUT_S  seconds in-flight requests get to finish on SIGTERM (default 60)
set -euo pipefail

args=(
  "--model-repository=${MODEL_REPOSITORY:-/models}"
  --http-port=8000
  --grpc-port=8001
  --metrics-port=8002
  --allow-metrics=true
  --allow-gpu-metrics=true
  --strict-readiness=true
  --exit-on-error=true
  --disable-auto-complete-config
  # Two vLLM engines that start together on one GPU each size their KV cache from free memory
  # while the other is still allocating; loading one model at a time avoids that race.
  "--model-load-thread-count=${TRITON_LOAD_THREADS:-1}"
  "--exit-timeout-secs=${TRITON_EXIT_TIMEOUT_S:-60}"
  # Python backend shared memory per model: start at 16 MiB and grow by 16 MiB, so multi-MB audio
  # files and images do not regrow the region 1 MiB at a time (the defaults).
  "--backend-config=python,shm-default-byte-size=16777216"
  "--backend-config=python,shm-growth-byte-size=16777216"
  # A `control_token` gRPC header reaches the models as that request parameter: the adapter
  # control token (serving.adapters.control_token_env) can travel outside the request body.
  "--grpc-header-forward-pattern=^control_token$"
)

case "${TRITON_MODEL_CONTROL:-none}" in
  none)
    args+=(--model-control-mode=none)
    ;;
  explicit)
    args+=(--model-control-mode=explicit "--load-model=*")
    if [[ -n "${TRITON_ADMIN_KEY:-}" ]]; then
      args+=(
        "--http-restricted-api=model-repository:admin-key=${TRITON_ADMIN_KEY}"
        "--grpc-restricted-protocol=model-repository:admin-key=${TRITON_ADMIN_KEY}"
      )
    else
      echo "lora-serving-entrypoint: WARNING: explicit model control without TRITON_ADMIN_KEY:" \
        "anyone who reaches port 8000/8001 can load and unload models" >&2
    fi
    ;;
  *)
    echo "lora-serving-entrypoint: TRITON_MODEL_CONTROL must be 'none' or 'explicit'," \
      "not '${TRITON_MODEL_CONTROL}'" >&2
    exit 2
    ;;
esac

exec /opt/tritonserver/bin/tritonserver "${args[@]}" "$@"
