"""An int8 copy of a Hugging Face checkpoint that vLLM serves with int8 GEMMs, made locally.

The format is compressed-tensors' W8A8 int8 ("int-quantized"), which vLLM reads from
config.json's `quantization_config` with no extra package: each targeted linear layer's weight
is stored as int8 with one float32 scale per output row (symmetric, per channel), and vLLM
quantizes the layer's input per token at run time (symmetric, dynamic). On CPU vLLM runs these
layers through oneDNN's int8 GEMM (AVX-512 VNNI / AMX); everything else (embeddings, convolutions,
norms, the output projection, attention) keeps the model's float type. faster-whisper's `int8`
compute type quantizes the same layers the same way.

No calibration data is needed (weights per channel, activations per token at run time).
`python -m lora_tools.demo int8 SRC DST` converts any checkpoint with the default targets'
names (Whisper's); the demo build writes whisper-base-int8/ from whisper-base/.
"""

import json
import re
import shutil
import tempfile
from pathlib import Path

from lora_tools.demo.folders import is_complete, publish

# Whisper's linear layers in its encoder and decoder blocks (attention projections and MLP).
WHISPER_LINEAR = re.compile(
    r"model\.(encoder|decoder)\.layers\.\d+\."
    r"((self_attn|encoder_attn)\.(q_proj|k_proj|v_proj|out_proj)|fc1|fc2)\.weight"
)
INT8_MAX = 127
WEIGHTS_FILE = "model.safetensors"
REQUIRED_FILES = (WEIGHTS_FILE, "config.json")


def quantize_rows(weight):
    """(int8 weight, float32 scale of shape [rows, 1]): symmetric, one scale per output row."""
    import torch

    weight = weight.float()
    scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / INT8_MAX
    quantized = (weight / scale).round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return quantized, scale


def quantization_config(ignore: list[str]) -> dict:
    """compressed-tensors' config for int8 weights per channel, int8 activations per token."""
    return {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 8,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "channel",
                    "dynamic": False,
                },
                "input_activations": {
                    "num_bits": 8,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "token",
                    "dynamic": True,
                },
            }
        },
        "ignore": ignore,
    }


def _is_complete(directory: Path) -> bool:
    if not is_complete(directory, REQUIRED_FILES):
        return False
    return "quantization_config" in json.loads((directory / "config.json").read_text())


def quantize_checkpoint(
    source: Path, out_dir: Path, targets: re.Pattern = WHISPER_LINEAR, ignore=("proj_out",)
) -> Path:
    """Write `source` with int8 weights for every tensor whose name `targets` matches fully.

    `ignore`: linear layers vLLM must leave in float (a Whisper's output projection, tied to its
    token embedding). Skipped if out_dir is already complete; written in a staging folder
    beside it and moved into place (lora_tools.demo.folders).
    """
    source, out_dir = Path(source).absolute(), Path(out_dir).absolute()
    if _is_complete(out_dir):
        return out_dir
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists but is not a complete model; remove it first")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        _write_quantized(source, staging, targets, ignore)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    publish(staging, out_dir, REQUIRED_FILES)
    return out_dir


def _write_quantized(source: Path, staging: Path, targets: re.Pattern, ignore) -> None:
    from safetensors.torch import load_file, save_file

    for item in source.iterdir():
        if item.is_file() and item.name != WEIGHTS_FILE:
            shutil.copy2(item, staging / item.name)
    tensors = {}
    quantized = 0
    for name, tensor in load_file(source / WEIGHTS_FILE).items():
        if targets.fullmatch(name) and tensor.dim() == 2:
            tensors[name], tensors[name.removesuffix("weight") + "weight_scale"] = quantize_rows(
                tensor
            )
            quantized += 1
        else:
            tensors[name] = tensor
    if not quantized:
        raise ValueError(f"no tensor in {source / WEIGHTS_FILE} matches {targets.pattern}")
    save_file(tensors, staging / WEIGHTS_FILE, metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = quantization_config(list(ignore))
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
