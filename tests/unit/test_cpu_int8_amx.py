"""cpu_int8_amx: a model loaded at float32 takes vLLM's oneDNN int8 path (the AMX one takes only
bf16/fp16 activations); the AMX path gets rows and gives back the input's leading dimensions."""

import pytest
import torch
from vllm.model_executor.kernels.linear.scaled_mm import cpu as scaled_mm_cpu

from lora_serving.vllm_plugin import cpu_int8_amx as int8_amx


@pytest.fixture
def two_d_only_kernel(monkeypatch):
    """The patched method over a stand-in for the SGL op: a product that, like it, refuses
    anything but a matrix."""
    calls = []

    def sgl(self, layer, x, bias=None):
        if x.dim() != 2:
            raise RuntimeError("mat1 must be a 2D tensor")
        calls.append(tuple(x.shape))
        out = x @ layer.weight.T
        return out if bias is None else out + bias

    monkeypatch.setitem(int8_amx._ORIGINAL, "sgl", sgl)
    return calls


def test_three_d_inputs_go_in_as_rows_and_come_back_in_shape(two_d_only_kernel):
    layer = torch.nn.Linear(6, 4)
    x = torch.randn(2, 5, 6)
    out = int8_amx._apply_weights_sgl(None, layer, x, layer.bias)
    assert two_d_only_kernel == [(10, 6)]
    assert out.shape == (2, 5, 4)
    assert torch.allclose(out, layer(x), atol=1e-6)


def test_matrices_pass_through(two_d_only_kernel):
    layer = torch.nn.Linear(6, 4, bias=False)
    x = torch.randn(3, 6)
    assert torch.equal(int8_amx._apply_weights_sgl(None, layer, x), x @ layer.weight.T)
    assert two_d_only_kernel == [(3, 6)]


class PathRecorder:
    """Stands in for the kernel: records which path processed the layer's weights."""

    def __init__(self):
        self.paths = []
        self.linear_method = None

    def _apply_weights_onednn(self, layer, x, bias=None):
        return "onednn"

    def process_weights_for_onednn(self, layer):
        self.paths.append("onednn")


@pytest.mark.parametrize(
    "model_dtype, path",
    [
        (torch.float32, "onednn"),
        (torch.bfloat16, "vllm's choice"),
        (torch.float16, "vllm's choice"),
    ],
)
def test_float32_models_take_the_onednn_path(monkeypatch, model_dtype, path):
    kernel = PathRecorder()
    monkeypatch.setitem(
        int8_amx._ORIGINAL, "process", lambda self, layer: self.paths.append("vllm's choice")
    )
    saved = torch.get_default_dtype()
    torch.set_default_dtype(model_dtype)  # as vLLM's loader sets it while loading a model
    try:
        int8_amx.process_weights_after_loading(kernel, torch.nn.Linear(2, 2))
    finally:
        torch.set_default_dtype(saved)
    assert kernel.paths == [path]
    if path == "onednn":
        assert kernel.linear_method(None, None) == "onednn"


def test_apply_patches_vllms_kernel_once(monkeypatch):
    kernel = scaled_mm_cpu.CPUInt8ScaledMMLinearKernel
    saved = dict(int8_amx._ORIGINAL)
    originals = {}
    for name, (key, patch) in int8_amx.PATCHES.items():
        current = getattr(kernel, name)
        originals[name] = saved[key] if current is patch else current  # register() ran before
        monkeypatch.setattr(kernel, name, originals[name])
    try:
        assert int8_amx.apply()
        assert not int8_amx.apply()
        for name, (key, patch) in int8_amx.PATCHES.items():
            assert getattr(kernel, name) is patch
            assert int8_amx._ORIGINAL[key] is originals[name]
    finally:
        int8_amx._ORIGINAL.clear()
        int8_amx._ORIGINAL.update(saved)
