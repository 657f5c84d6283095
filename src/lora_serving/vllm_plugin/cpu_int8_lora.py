"""On CPU, LoRA layers wrap int8 (W8A8) base layers.

vLLM's CPU int8 GEMM (oneDNN, `CPUInt8ScaledMMLinearKernel`) packs a layer's int8 weight into
its own handle and sets `layer.weight = None`. vLLM's LoRA wrappers then fail at start-up:
`_get_lora_device` reads `base_layer.weight.device`, and a present but None weight hides the
other quantized weight names it would try. Such a layer's device is that of its weight scale.
Nothing else in the LoRA path reads the base weight: the base product goes through the layer's
quant method, the adapter's through the punica ops.
"""

import importlib
from typing import Any

import torch

LORA_LAYERS_MODULE = "vllm.lora.layers.base_linear"  # imports _get_lora_device by name

_ORIGINAL: dict[str, Any] = {}


def lora_device(base_layer: torch.nn.Module) -> torch.device:
    """Where a LoRA wrapper of `base_layer` keeps its tensors."""
    if getattr(base_layer, "weight", 0) is None:
        for name in ("weight_scale", "input_scale"):
            tensor = getattr(base_layer, name, None)
            if isinstance(tensor, torch.Tensor):
                return tensor.device
        return torch.device("cpu")
    return _ORIGINAL["device"](base_layer)


def apply() -> bool:
    """Route the LoRA wrappers' device lookup through `lora_device`; True if this call did."""
    module = importlib.import_module(LORA_LAYERS_MODULE)
    current = getattr(module, "_get_lora_device", None)
    if current is None:
        raise RuntimeError(f"{LORA_LAYERS_MODULE}._get_lora_device is gone: re-check cpu_int8_lora")
    if current is lora_device:
        return False
    _ORIGINAL["device"] = current
    module._get_lora_device = lora_device
    return True
