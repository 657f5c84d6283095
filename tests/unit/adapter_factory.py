"""Tiny base models and PEFT adapters on disk for the adapter unit tests (headers are all that
the checks read, so the tensors are small and mostly zero)."""

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

# module -> (out_features, in_features) of the tiny base model
BASE_MODULES = {
    "model.layers.0.mlp.fc1": (8, 4),
    "model.layers.0.mlp.fc2": (4, 8),
    "visual.blocks.0.attn.qkv": (12, 4),
}


def make_base(folder: Path, name_or_path: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {
        f"{module}.weight": np.zeros(shape, np.float32) for module, shape in BASE_MODULES.items()
    }
    tensors["model.layers.0.mlp.fc1.bias"] = np.zeros(8, np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    config = {"model_type": "tiny"}
    if name_or_path:
        config["_name_or_path"] = name_or_path
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def adapter_module(module: str) -> str:
    """The name PEFT gives a base module with transformers 5 (Qwen-VL layout)."""
    module = module.replace("model.layers.", "model.language_model.layers.")
    module = module.replace("visual.", "model.visual.")
    return f"base_model.model.{module}"


def make_adapter(
    folder: Path,
    *,
    rank: int = 4,
    base: Path | str | None = None,
    modules: dict[str, tuple[int, int]] | None = None,
    seed: int = 0,
    weights: str = "safetensors",
    config: dict | None = None,
) -> Path:
    """A PEFT adapter over `modules` (default: every BASE_MODULES entry, fitting shapes)."""
    folder.mkdir(parents=True, exist_ok=True)
    modules = BASE_MODULES if modules is None else modules
    rng = np.random.default_rng(seed)
    tensors = {}
    for module, (out_features, in_features) in modules.items():
        name = adapter_module(module)
        tensors[f"{name}.lora_A.weight"] = rng.standard_normal((rank, in_features), np.float32)
        tensors[f"{name}.lora_B.weight"] = rng.standard_normal((out_features, rank), np.float32)
    peft = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": ["fc1", "fc2", "qkv"],
        "base_model_name_or_path": str(base) if base else None,
        **(config or {}),
    }
    (folder / "adapter_config.json").write_text(json.dumps(peft))
    if weights == "safetensors":
        save_file(tensors, str(folder / "adapter_model.safetensors"))
    elif weights == "bin":
        (folder / "adapter_model.bin").write_bytes(b"\x80\x04pickle")
    return folder


def publish(source: Path, root: Path, name: str) -> Path:
    """Move a finished adapter folder into a root atomically, as operators should."""
    root.mkdir(parents=True, exist_ok=True)
    target = root / name
    source.rename(target)
    return target
