"""Checks the GPU image's build runs (docker/Dockerfile), so a wrong base tag or lock fails the
build, not the first request: `python -m lora_tools.image_check`.

- Python is the one requirements/gpu.txt is locked for (the Python backend stub embeds it).
- vLLM is the release our plugin was written for.
- cuda-python is the CUDA 13 metapackage over cuda-bindings of the same release: the old
  all-in-one cuda-python 12.x wheel ships its own `cuda/bindings/*.so`, which overwrite
  cuda-bindings 13's and look for CUDA 12 libraries the image does not have (torch imports
  `cuda.bindings.runtime` when `torch.cuda` loads).
- numpy is the locked one, our vLLM plugin is registered, FlashInfer's sampler (which compiles
  kernels with nvcc at first use; the image has no CUDA compiler) is off.
"""

import importlib.metadata as metadata
import os
import sys
from collections.abc import Callable

from lora_serving.vllm_plugin import SUPPORTED_VLLM_MINOR

PYTHON = (3, 12)
CUDA_MAJOR = 13
PLUGIN = "lora_serving.vllm_plugin:register"


def cuda_python_problems(versions: dict[str, str | None], files: Callable[[str], list[str]]):
    """versions: distribution -> version (None when missing); files(dist) lists its files."""
    problems = []
    python, bindings = versions.get("cuda-python"), versions.get("cuda-bindings")
    if bindings is None:
        problems.append("cuda-bindings is not installed (torch needs it)")
    elif int(bindings.split(".")[0]) != CUDA_MAJOR:
        problems.append(f"cuda-bindings {bindings} is not CUDA {CUDA_MAJOR}")
    if python is not None:
        if python.split(".")[:2] != (bindings or "").split(".")[:2]:
            problems.append(
                f"cuda-python {python} does not match cuda-bindings {bindings}: pin "
                f"cuda-python to the cuda-bindings release (requirements/gpu.in)"
            )
        own = [path for path in files("cuda-python") if path.startswith("cuda/bindings/")]
        if own:
            problems.append(
                f"cuda-python {python} ships its own cuda/bindings files ({own[0]}, ...): "
                "the old all-in-one wheel, mixed into cuda-bindings' tree"
            )
    return problems


def problems(
    versions: dict[str, str | None],
    python: tuple[int, int],
    plugins: dict[str, str],
    files: Callable[[str], list[str]],
    environ: dict[str, str],
    locked_numpy: str | None = None,
) -> list[str]:
    found = []
    if python != PYTHON:
        found.append(
            f"Python {python[0]}.{python[1]}: requirements/gpu.txt is locked for "
            f"{PYTHON[0]}.{PYTHON[1]} (the base image's Python)"
        )
    vllm = versions.get("vllm")
    if vllm is None or tuple(int(p) for p in vllm.split(".")[:2]) != SUPPORTED_VLLM_MINOR:
        found.append(f"vllm {vllm}: the plugin is written for {SUPPORTED_VLLM_MINOR}")
    found += cuda_python_problems(versions, files)
    if locked_numpy is not None and versions.get("numpy") != locked_numpy:
        found.append(f"numpy {versions.get('numpy')}, the lock says {locked_numpy}")
    if plugins.get("lora_serving") != PLUGIN:
        found.append(f"vLLM plugin entry point lora_serving missing or wrong: {plugins}")
    if environ.get("VLLM_USE_FLASHINFER_SAMPLER") != "0":
        found.append("VLLM_USE_FLASHINFER_SAMPLER is not 0 (its kernels need nvcc at first use)")
    return found


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _files(dist: str) -> list[str]:
    try:
        return [str(path) for path in metadata.files(dist) or []]
    except metadata.PackageNotFoundError:
        return []


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    locked_numpy = args[0] if args else None  # the lock's numpy, passed by the Dockerfile
    dists = ("vllm", "torch", "numpy", "cuda-python", "cuda-bindings")
    versions = {dist: _version(dist) for dist in dists}
    plugins = {e.name: e.value for e in metadata.entry_points(group="vllm.general_plugins")}
    found = problems(
        versions, sys.version_info[:2], plugins, _files, dict(os.environ), locked_numpy
    )
    for problem in found:
        print(f"image_check: {problem}", file=sys.stderr)
    print("image_check:", ", ".join(f"{d} {v}" for d, v in versions.items()))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
