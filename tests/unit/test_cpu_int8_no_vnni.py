"""cpu_int8_no_vnni: on an x86 CPU without VNNI, int8 layers run a float GEMM over their
dequantized weights, because oneDNN's int8 GEMM saturates there."""

import platform

import pytest
import torch
from vllm import _custom_ops as ops

from lora_serving.dtype_choice import cpu_flags
from lora_serving.vllm_plugin import cpu_int8_no_vnni as no_vnni


@pytest.mark.parametrize(
    "machine, flags, expected",
    [
        ("x86_64", frozenset({"avx2", "avx"}), True),  # AMD EPYC with AVX2 only
        ("x86_64", frozenset({"avx2", "avx512f", "avx512_vnni"}), False),
        ("x86_64", frozenset({"avx2", "avx_vnni"}), False),
        ("x86_64", frozenset({"avx2", "amx_int8", "amx_tile"}), False),
        ("aarch64", frozenset(), False),  # not oneDNN's x86 int8 kernels
    ],
)
def test_saturates_only_on_x86_without_vnni(machine, flags, expected):
    assert no_vnni.saturates(machine, flags) is expected


def onednn_product(weight: torch.Tensor, scale: torch.Tensor, x_q: torch.Tensor) -> torch.Tensor:
    """vLLM's oneDNN int8 GEMM on this CPU, as the kernel calls it (weight [out, in] int8)."""
    handler = ops.create_onednn_scaled_mm(weight.t(), scale, torch.float32, True, False, 32)
    out = torch.empty((x_q.shape[0], weight.shape[0]))
    ops.onednn_scaled_mm(handler, x_q, out, torch.ones(x_q.shape[0], 1), None, None, None)
    return out


def test_the_defect_is_what_this_cpu_does():
    """Full-range int8 weights and inputs through oneDNN: exact with VNNI, clipped without; the
    same GEMM with 7-bit weights is exact everywhere (what oneDNN asks for on such CPUs)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-127, 128, (64, 256), dtype=torch.int8, generator=generator)
    x_q = torch.randint(-127, 128, (8, 256), dtype=torch.int8, generator=generator)
    exact = x_q.double() @ weight.t().double()
    error = (onednn_product(weight, torch.ones(64), x_q).double() - exact).abs().max()
    if no_vnni.saturates(platform.machine(), cpu_flags()):
        assert error > 1000
    else:
        assert error == 0
    seven_bit = (weight // 2).to(torch.int8)
    exact = x_q.double() @ seven_bit.t().double()
    assert torch.equal(onednn_product(seven_bit, torch.ones(64), x_q).double(), exact)


class KernelStandIn:
    """What the patched methods read from vLLM's kernel object."""

    layer_param_names = ("weight", "weight_scale", "input_scale", "input_zero_point", "azp_adj")

    def __init__(self, channelwise: bool):
        self.config = type("Config", (), {"is_channelwise": channelwise})()


def int8_layer(weight: torch.Tensor, scale: torch.Tensor, widths: list[int]) -> torch.nn.Module:
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(scale, requires_grad=False)
    layer.logical_widths = widths
    return layer


@pytest.mark.parametrize("model_dtype", [torch.float32, torch.bfloat16])
def test_layer_computes_with_its_dequantized_weights(model_dtype):
    generator = torch.Generator().manual_seed(1)
    weight = torch.randint(-127, 128, (6, 5), dtype=torch.int8, generator=generator)
    scale = torch.rand(6, 1, generator=generator)
    layer = int8_layer(weight, scale, [6])
    kernel = KernelStandIn(channelwise=True)
    saved = torch.get_default_dtype()
    torch.set_default_dtype(model_dtype)  # as vLLM's loader sets it while loading a model
    try:
        no_vnni.process_weights_for_onednn(kernel, layer)
    finally:
        torch.set_default_dtype(saved)
    expected_weight = (weight.float() * scale).to(model_dtype)
    assert layer.weight.dtype == model_dtype
    assert torch.equal(layer.weight, expected_weight)
    x = torch.randn(2, 3, 5, generator=generator).to(model_dtype)
    bias = torch.randn(6, generator=generator).to(model_dtype)
    out = no_vnni._apply_weights_onednn(kernel, layer, x, bias)
    assert out.shape == (2, 3, 6)
    assert torch.equal(out, torch.nn.functional.linear(x, expected_weight, bias))


def test_fused_layer_with_one_scale_per_part_gets_one_per_row():
    weight = torch.ones(5, 2, dtype=torch.int8)
    layer = int8_layer(weight, torch.tensor([2.0, 3.0]), [2, 3])  # e.g. Whisper's kv_proj
    no_vnni.process_weights_for_onednn(KernelStandIn(channelwise=False), layer)
    assert torch.equal(layer.weight[:, 0], torch.tensor([2.0, 2.0, 3.0, 3.0, 3.0]))


def test_apply_patches_only_where_needed():
    assert no_vnni.apply(machine="x86_64", flags=frozenset({"avx512_vnni"})) is False
