"""On a CPU with AMX, int8 (W8A8) layers serve as they do on other CPUs.

Defects (vLLM 0.32): `CPUInt8ScaledMMLinearKernel` has two paths. The oneDNN one (CPUs without
AMX) takes float32, bf16 or fp16 activations of any rank. The SGL one, chosen on x86 with AMX
for symmetric activations (ours: per token, dynamic), passes the input straight to
`int8_scaled_mm_with_quant`, which takes
- only bf16/fp16 activations: an int8 model served at float32 (the exactness checks' dtype)
  died on its first request ("expect A to be bfloat16 or half");
- only 2-D matrices: Whisper's encoder runs its layers on (windows, 1500, hidden), and an int8
  whisper-base at bf16 died on its first request too ("mat1 must be a 2D tensor").
Here a model loaded at float32 takes the oneDNN path, as it would without AMX, and the SGL path
gets rows, as the oneDNN path makes them, with the input's leading dimensions put back after.
"""

import importlib
from typing import Any

import torch

from lora_serving.vllm_plugin.wrapping import replace_methods

KERNEL_MODULE = "vllm.model_executor.kernels.linear.scaled_mm.cpu"
KERNEL_CLASS = "CPUInt8ScaledMMLinearKernel"
SGL_ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)

_ORIGINAL: dict[str, Any] = {}


def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
    # vLLM loads a model under its dtype as torch's default; activations will have it too.
    if torch.get_default_dtype() in SGL_ACTIVATION_DTYPES:
        _ORIGINAL["process"](self, layer)
        return
    self.linear_method = self._apply_weights_onednn
    self.process_weights_for_onednn(layer)


def _apply_weights_sgl(self, layer: torch.nn.Module, x: torch.Tensor, bias=None) -> torch.Tensor:
    if x.dim() <= 2:
        return _ORIGINAL["sgl"](self, layer, x, bias)
    out = _ORIGINAL["sgl"](self, layer, x.reshape(-1, x.shape[-1]), bias)
    return out.reshape(*x.shape[:-1], out.shape[-1])


PATCHES = {
    "process_weights_after_loading": ("process", process_weights_after_loading),
    "_apply_weights_sgl": ("sgl", _apply_weights_sgl),
}


def apply() -> bool:
    """Patch the kernel's path choice and its SGL path; True if this call did."""
    kernel = getattr(importlib.import_module(KERNEL_MODULE), KERNEL_CLASS, None)
    missing = [name for name in PATCHES if getattr(kernel, name, None) is None]
    if missing or not hasattr(kernel, "_apply_weights_onednn"):
        raise RuntimeError(
            f"{KERNEL_MODULE}.{KERNEL_CLASS} has no {missing or '_apply_weights_onednn'}: "
            "re-check cpu_int8_amx"
        )
    return replace_methods(kernel, PATCHES, _ORIGINAL)
