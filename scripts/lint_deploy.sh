#!/usr/bin/env bash
# Lints what ships for GPUs, offline once its linters are installed:
#   docker/Dockerfile              hadolint
#   docker/compose.yaml            the compose-spec JSON schema (check-jsonschema's vendored copy)
#   k8s/*.yaml                     Kubernetes' JSON schemas, strict (no unknown fields), for the
#   k8s/inference-gateway/epp.yaml oldest and newest Kubernetes versions we target
#   k8s/inference-gateway/{inference-pool,httproute}.yaml
#                                  their CRDs' schemas, strict (k8s/schemas/, from the upstream
#                                  CRDs by scripts/crd_schema.py; check-jsonschema)
#   docker/compose.yaml, k8s/      yamllint
#   docker/entrypoint.sh, scripts/{lint_deploy,gpu_check,gpu_venv,genai_perf,openai_sdk,peer_env,
#     whisper_tiktoken,openai_whisper,tool_env}.sh  shellcheck
#   requirements/, pyproject.toml  the GPU lock's inputs, the `gpu` extra and the CPU lock's inputs
#                                  each resolve (uv pip compile; needs the package index)
# The cross-checks between these files (ports, labels, volumes, model.json paths, metric names)
# are unit tests: tests/unit/test_deploy_*.py.
#
# The linters are pinned in requirements/lint.txt and installed on first use into their own
# virtual environment under ${LORA_SERVING_CACHE:-~/.cache/lora-serving}/lint-tools (never into
# .venv), again only when the lock changes (scripts/tool_env.sh). Exit status: 0 when every
# linter passes.
set -euo pipefail
cd "$(dirname "$0")/.."

LOCK=requirements/lint.txt
# Kubernetes versions the manifests are checked against (kubernetes-validate ships 1.25-1.37).
KUBE_VERSIONS=(1.30.0 1.37.0)
MANIFESTS=(k8s/pvc.yaml k8s/deployment.yaml k8s/service.yaml k8s/networkpolicy.yaml k8s/hpa.yaml
  k8s/inference-gateway/epp.yaml)
# Custom resources: manifest=schema (InferencePool: gateway-api-inference-extension v1.6.0;
# HTTPRoute: Gateway API v1.6.1).
CUSTOM_RESOURCES=(k8s/inference-gateway/inference-pool.yaml=k8s/schemas/inferencepool-v1.json
  k8s/inference-gateway/httproute.yaml=k8s/schemas/httproute-v1.json)
SHELL_SCRIPTS=(docker/entrypoint.sh scripts/lint_deploy.sh scripts/gpu_check.sh scripts/gpu_venv.sh
  scripts/genai_perf.sh scripts/openai_sdk.sh scripts/peer_env.sh scripts/whisper_tiktoken.sh
  scripts/openai_whisper.sh scripts/s3_server.sh scripts/tool_env.sh)
YAMLLINT_CONFIG='{extends: default, rules: {line-length: {max: 100}, document-start: disable}}'

failures=()
run() {  # run NAME COMMAND...: print the command's findings, remember a failure, go on
  local name=$1
  shift
  echo "== $name"
  if "$@"; then
    echo "   ok"
  else
    failures+=("$name")
  fi
}

bin=$(scripts/tool_env.sh --quiet lint-tools "$LOCK")/bin

run "hadolint docker/Dockerfile" "$bin/hadolint" --no-color docker/Dockerfile
run "compose-spec schema: docker/compose.yaml" \
  "$bin/check-jsonschema" --builtin-schema vendor.compose-spec docker/compose.yaml
for version in "${KUBE_VERSIONS[@]}"; do
  run "kubernetes-validate --strict (Kubernetes $version): ${MANIFESTS[*]}" \
    "$bin/kubernetes-validate" --strict --no-warn -k "$version" "${MANIFESTS[@]}"
done
for pair in "${CUSTOM_RESOURCES[@]}"; do
  run "CRD schema, strict: ${pair%%=*}" \
    "$bin/check-jsonschema" --schemafile "${pair##*=}" "${pair%%=*}"
done
run "yamllint docker/compose.yaml k8s/" "$bin/yamllint" --strict -d "$YAMLLINT_CONFIG" \
  docker/compose.yaml k8s
run "shellcheck ${SHELL_SCRIPTS[*]}" "$bin/shellcheck" "${SHELL_SCRIPTS[@]}"

UV=.venv/bin/uv
[[ -x "$UV" ]] || UV=uv
resolve() {  # resolve PYTHON_VERSION ARGS...: does this set of requirements resolve at all?
  local version=$1
  shift
  "$UV" pip compile -q --python-version "$version" --python-platform x86_64-manylinux_2_28 \
    "$@" -o /dev/null
}
run "resolves: requirements/gpu.in + gpu-overrides.txt (Python 3.12, the GPU image)" \
  resolve 3.12 requirements/gpu.in --override requirements/gpu-overrides.txt
run "resolves: pyproject.toml --extra gpu (Python 3.12)" resolve 3.12 pyproject.toml --extra gpu
run "resolves: requirements/cpu.in + overrides.txt (Python 3.11, CPU)" \
  resolve 3.11 requirements/cpu.in --override requirements/overrides.txt

if ((${#failures[@]})); then
  echo "lint_deploy: FAILED: ${failures[*]}" >&2
  exit 1
fi
echo "lint_deploy: all passed"
