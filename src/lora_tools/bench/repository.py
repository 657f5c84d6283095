"""The benchmark's own Triton model repository and adapters, under results/work/.

For each model two entries, copied from the shipped repository (config.pbtxt, 1/model.py) with a
model.json of their own (the shipped one, paths made absolute, plus the bench's overrides):
  <model>_lora  the served configuration with `many_adapters` adapters in multi_lora.json and
                max_loras / max_cpu_loras from the bench config;
  <model>_base  the same engine without LoRA (enable_lora off): "the base model only" of P2.
The in-process baseline (P1) starts its AsyncLLM from <model>_lora's model.json.
"""

import copy
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from lora_serving.launcher import REPO_ROOT
from lora_tools.bench.config import BenchConfig

# Bench model kind -> (shipped Triton model, our task name)
SHIPPED = {"whisper": ("whisper_lora", "transcription"), "qwen_vl": ("qwen_vl_lora", "vision_chat")}
# Engine arguments that only mean something with LoRA on.
LORA_ARGS = (
    "enable_lora",
    "max_loras",
    "max_lora_rank",
    "max_cpu_loras",
    "enable_tower_connector_lora",
    "lora_dtype",
    "lora_extra_vocab_size",
    "fully_sharded_loras",
    "default_mm_loras",
    "lora_target_modules",
)
# serving.adapters keys that point at folders of the shipped deployment (its adapter fleet):
# the bench serves exactly its own adapters, listed in multi_lora.json.
FLEET_PATH_KEYS = ("roots", "snapshot_dir")


@dataclass(frozen=True)
class BenchModel:
    kind: str  # whisper | qwen_vl
    task: str  # transcription | vision_chat
    lora_name: str  # Triton model names in the bench repository
    base_name: str
    lora_model_json: Path
    adapters: dict[str, Path]  # name -> folder, in multi_lora.json order
    adapter_file_bytes: int  # adapter_model.safetensors of the first adapter
    base_model_dir: Path


def _resolve(path: str, relative_to: Path) -> str:
    candidate = Path(path)
    if candidate.is_absolute():
        return str(candidate)
    resolved = (relative_to / candidate).resolve()
    return str(resolved) if resolved.exists() else path


def bench_model_json(
    shipped: dict,
    shipped_dir: Path,
    *,
    lora: bool,
    max_loras: int,
    max_cpu_loras: int,
    engine_overrides: dict,
    environment_overrides: dict,
) -> dict:
    """The shipped model.json made position-independent, with the bench's settings."""
    data = copy.deepcopy(shipped)
    for key in ("model", "tokenizer"):
        if isinstance(data.get(key), str):
            data[key] = _resolve(data[key], shipped_dir)
    serving = data.setdefault("serving", {})
    if isinstance(serving.get("int8_model"), str):
        serving["int8_model"] = _resolve(serving["int8_model"], shipped_dir)
    adapters = serving.get("adapters")
    if isinstance(adapters, dict):
        for key in FLEET_PATH_KEYS:
            adapters.pop(key, None)
    if lora:
        data.update(enable_lora=True, max_loras=max_loras, max_cpu_loras=max_cpu_loras)
        serving["multi_lora_file"] = "multi_lora.json"
    else:
        for key in LORA_ARGS:
            data.pop(key, None)
        serving.pop("adapters", None)
        serving.pop("multi_lora_file", None)
    data.update(engine_overrides)
    if environment_overrides:
        data["environment"] = {**data.get("environment", {}), **environment_overrides}
    return data


MODEL_PY_SOURCE = REPO_ROOT / "model_repository"


def _write_model(
    source: Path, shipped_name: str, out_repo: Path, name: str, model_json: dict
) -> Path:
    folder = out_repo / name
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "1").mkdir(parents=True)
    config = (source / shipped_name / "config.pbtxt").read_text()
    line = f'name: "{shipped_name}"'
    if line not in config:
        raise ValueError(f"{source / shipped_name / 'config.pbtxt'} has no line {line}")
    renamed = config.replace(line, f'name: "{name}"', 1)
    (folder / "config.pbtxt").write_text(renamed)
    # One model.py per model for every repository (model_repository_gpu/ has none of its own).
    shutil.copy2(MODEL_PY_SOURCE / shipped_name / "1" / "model.py", folder / "1" / "model.py")
    (folder / "1" / "model.json").write_text(json.dumps(model_json, indent=2))
    return folder / "1"


def make_adapters(config: BenchConfig, kind: str, base_dir: Path, out_root: Path) -> list[Path]:
    """`many_adapters` deterministic adapters (kept between runs; built once)."""
    from lora_tools.bench.perf_data import adapter_names

    names = adapter_names(config.many_adapters)
    if kind == "whisper":
        from lora_tools.demo import whisper

        targets = (
            whisper.DECODER_LORA_TARGETS
            if config.whisper_adapter_targets == "decoder"
            else whisper.ALL_LORA_TARGETS
        )
        folder = out_root / f"whisper-{config.whisper_adapter_targets}"
        return whisper.make_whisper_adapters(
            base_dir, folder, names=names, seed=config.adapter_seed, targets=targets
        )
    from lora_tools.demo.qwen_vl import make_qwen_vl_adapters

    return make_qwen_vl_adapters(
        base_dir, out_root / f"qwen_vl-{base_dir.name}", names=names, seed=config.adapter_seed
    )


def build(config: BenchConfig, kind: str, work: Path) -> BenchModel:
    """Write <kind>_lora and <kind>_base into work/repository; adapters into work/adapters."""
    shipped_name, task = SHIPPED[kind]
    source = config.source_repository
    shipped_dir = source / shipped_name / "1"
    shipped = json.loads((shipped_dir / "model.json").read_text())
    base_dir = Path(_resolve(shipped["model"], shipped_dir))
    overrides = {**config.engine_overrides, **config.model(kind).engine_overrides}
    common = dict(
        max_loras=config.max_loras,
        max_cpu_loras=config.max_cpu_loras,
        engine_overrides=overrides,
        environment_overrides=config.environment_overrides,
    )
    repo = work / "repository"
    lora_name, base_name = f"{kind}_lora", f"{kind}_base"
    lora_dir = _write_model(
        source,
        shipped_name,
        repo,
        lora_name,
        bench_model_json(shipped, shipped_dir, lora=True, **common),
    )
    _write_model(
        source,
        shipped_name,
        repo,
        base_name,
        bench_model_json(shipped, shipped_dir, lora=False, **common),
    )
    folders = make_adapters(config, kind, base_dir, work / "adapters")
    adapters = {folder.name: folder.resolve() for folder in folders}
    (lora_dir / "multi_lora.json").write_text(
        json.dumps({name: str(path) for name, path in adapters.items()}, indent=2)
    )
    first = next(iter(adapters.values()))
    return BenchModel(
        kind=kind,
        task=task,
        lora_name=lora_name,
        base_name=base_name,
        lora_model_json=lora_dir / "model.json",
        adapters=adapters,
        adapter_file_bytes=(first / "adapter_model.safetensors").stat().st_size,
        base_model_dir=base_dir,
    )


def build_served_only(config: BenchConfig, kind: str, repo: Path) -> str:
    """Only the shipped <model> (e.g. whisper_lora, LoRA on, no adapters listed) in `repo`, with
    the bench's engine overrides: the word-error-rate part serves it as users get it."""
    shipped_name, _ = SHIPPED[kind]
    shipped_dir = config.source_repository / shipped_name / "1"
    shipped = json.loads((shipped_dir / "model.json").read_text())
    model_json = bench_model_json(
        shipped,
        shipped_dir,
        lora=True,
        max_loras=shipped.get("max_loras", config.max_loras),
        max_cpu_loras=shipped.get("max_cpu_loras", config.max_cpu_loras),
        engine_overrides={**config.engine_overrides, **config.model(kind).engine_overrides},
        environment_overrides=config.environment_overrides,
    )
    folder = _write_model(config.source_repository, shipped_name, repo, shipped_name, model_json)
    (folder / "multi_lora.json").write_text("{}")
    return shipped_name
