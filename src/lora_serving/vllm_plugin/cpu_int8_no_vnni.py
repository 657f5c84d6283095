"""On an x86 CPU without VNNI, int8 (W8A8) layers give the right product.

Defect (vLLM 0.32, `CPUInt8ScaledMMLinearKernel`'s oneDNN path): without VNNI (AVX-512 VNNI,
AVX-VNNI or AMX-INT8) oneDNN multiplies int8 with AVX2's `vpmaddubsw`, which adds each pair of
u8 x s8 products in a saturating int16. vLLM's activations are symmetric s8, shifted to u8 by 128
for oneDNN, so two products of full-range weights pass 32767 and are clipped. Measured on an AMD
EPYC with AVX2 only: random full-range int8 weights and inputs came out up to 74 % wrong (6 %
on average); with 7-bit weights the same GEMM was exact, as oneDNN's documentation asks for such
CPUs. The int8 whisper-base then chose other tokens from the first step on.

Here, on such a CPU, an int8 layer keeps its weights dequantized (int8 x per-row scale, in the
model's float type) and runs a float GEMM on its unquantized inputs: the int8 checkpoint's
weights exactly, not its activation rounding, at float speed. On that EPYC oneDNN's int8 was
only 1.45x float32 for an encoder layer (1500 x 512 x 2048) and 5x slower for a decode step
(4 rows), so a 7-bit requantization, which would cost a bit of every weight, buys nothing.
"""

import importlib
import platform
from typing import Any

import torch

from lora_serving.dtype_choice import cpu_flags
from lora_serving.vllm_plugin.wrapping import replace_methods

KERNEL_MODULE = "vllm.model_executor.kernels.linear.scaled_mm.cpu"
KERNEL_CLASS = "CPUInt8ScaledMMLinearKernel"
# Any one of these gives oneDNN an int8 dot product that accumulates in int32.
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
X86_MACHINES = ("x86_64", "amd64", "i686")

_ORIGINAL: dict[str, Any] = {}


def saturates(machine: str, flags: frozenset[str]) -> bool:
    """True where oneDNN's int8 GEMM adds products in saturating int16 (x86 without VNNI)."""
    return machine.lower() in X86_MACHINES and not flags & VNNI_FLAGS


def dequantized_weight(
    weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """int8 [out, in] x scale (per row, or one for all) -> [out, in] in `dtype`."""
    return (weight.to(torch.float32) * scale.to(torch.float32).reshape(-1, 1)).to(dtype)


def process_weights_for_onednn(self, layer: torch.nn.Module) -> None:
    from vllm.model_executor.layers.quantization.utils import replace_parameter
    from vllm.model_executor.layers.quantization.utils.w8a8_utils import convert_to_channelwise

    w_q_name, w_s_name, _, _, _ = self.layer_param_names
    scale = getattr(layer, w_s_name)
    if len(layer.logical_widths) > 1 and not self.config.is_channelwise:
        # A fused layer (qkv, kv) with one scale per part: one per row, as upstream converts.
        scale = convert_to_channelwise(scale, layer.logical_widths)
    # vLLM loads a model under its dtype as torch's default; activations will have it too.
    weight = dequantized_weight(getattr(layer, w_q_name), scale, torch.get_default_dtype())
    replace_parameter(layer, w_q_name, torch.nn.Parameter(weight, requires_grad=False))


def _apply_weights_onednn(
    self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    return torch.nn.functional.linear(x, getattr(layer, self.layer_param_names[0]), bias)


PATCHES = {
    "process_weights_for_onednn": ("process", process_weights_for_onednn),
    "_apply_weights_onednn": ("apply", _apply_weights_onednn),
}


def apply(machine: str | None = None, flags: frozenset[str] | None = None) -> bool:
    """On a CPU whose int8 GEMM saturates, patch the oneDNN path; True if this call did."""
    if not saturates(machine or platform.machine(), cpu_flags() if flags is None else flags):
        return False
    kernel = getattr(importlib.import_module(KERNEL_MODULE), KERNEL_CLASS, None)
    missing = [name for name in PATCHES if getattr(kernel, name, None) is None]
    if missing:
        raise RuntimeError(
            f"{KERNEL_MODULE}.{KERNEL_CLASS} has no {missing}: re-check cpu_int8_no_vnni"
        )
    return replace_methods(kernel, PATCHES, _ORIGINAL)
