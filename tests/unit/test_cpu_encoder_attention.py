"""cpu_encoder_attention: vLLM's encoder attention at bf16/fp16 on CPU runs in blocks of
reduced-precision GEMMs; it equals float32 attention within bf16 rounding, and float32 inputs
still go to PyTorch's kernel unchanged."""

import pytest
import torch
import torch.nn.functional as F
from vllm.v1.attention.ops import vit_attn_wrappers

from lora_serving.vllm_plugin import cpu_encoder_attention as attention


@pytest.fixture
def patched(monkeypatch):
    saved_function = vit_attn_wrappers.apply_sdpa
    saved = dict(attention._ORIGINAL)
    if saved_function is attention._apply_sdpa:  # an earlier register() applied it already
        vit_attn_wrappers.apply_sdpa = saved["apply_sdpa"]
    monkeypatch.setenv(attention.ENV, "1")  # on whatever this CPU is
    attention._ORIGINAL.clear()
    assert attention.apply()
    assert not attention.apply()  # applied once
    yield
    vit_attn_wrappers.apply_sdpa = saved_function
    attention._ORIGINAL.clear()
    attention._ORIGINAL.update(saved)


def float32_attention(q, k, v, scale=None):
    """The float32 reference, (batch, seq, heads, size) in and out."""
    q, k, v = (x.float().transpose(1, 2) for x in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, scale=scale).transpose(1, 2)


def qkv_views(batch, seq, heads, size, dtype, seed=0):
    """q, k, v as vLLM passes them: (batch, seq, heads, size) views of one projection output."""
    generator = torch.Generator().manual_seed(seed)
    packed = torch.randn(batch, seq, 3 * heads * size, generator=generator).to(dtype)
    return tuple(t.view(batch, seq, heads, size) for t in packed.split(heads * size, dim=-1))


@pytest.mark.parametrize(
    "batch, seq, heads, size, scale",
    [
        (1, 1500, 8, 64, None),  # Whisper-base's encoder: several blocks of query rows
        (2, 257, 4, 80, 0.3),  # a last block shorter than the others, a scale of its own
        (1, 5, 16, 16, None),  # fewer rows than one block
    ],
)
def test_blocked_attention_is_float32_attention_within_bf16_rounding(
    batch, seq, heads, size, scale
):
    q, k, v = qkv_views(batch, seq, heads, size, torch.bfloat16)
    reference = float32_attention(q, k, v, scale)
    # The blocks, the scale and the layouts are right: in float32 it is attention exactly.
    in_float32 = attention.blocked_attention(q.float(), k.float(), v.float(), scale)
    assert (in_float32 - reference).abs().max() < 1e-5

    out = attention.blocked_attention(q, k, v, scale)
    assert out.shape == (batch, seq, heads, size) and out.dtype == torch.bfloat16
    # What bf16 costs: scores and probabilities rounded to 8 bits of mantissa (large scores, as
    # with scale 0.3 on 80-wide heads, lose the most: exp turns a score's rounding into a
    # relative error of the weight).
    error = (out.float() - reference).abs()
    assert error.mean() < 4e-3 and error.max() < 0.1


def test_blocks_keep_their_scores_within_the_byte_budget():
    rows = attention.block_rows(heads=8, keys=1500, itemsize=2)
    assert rows * 8 * 1500 * 2 <= attention.BLOCK_BYTES
    assert (rows + 1) * 8 * 1500 * 2 > attention.BLOCK_BYTES
    assert attention.block_rows(heads=64, keys=100_000, itemsize=2) == attention.MIN_BLOCK_ROWS


def test_bf16_goes_blocked_and_float32_to_pytorchs_kernel(patched, monkeypatch):
    calls = []
    original = attention._ORIGINAL["apply_sdpa"]

    def counting(*args, **kwargs):
        calls.append(args[0].dtype)
        return original(*args, **kwargs)

    monkeypatch.setitem(attention._ORIGINAL, "apply_sdpa", counting)
    q, k, v = qkv_views(1, 40, 2, 8, torch.bfloat16)
    blocked = vit_attn_wrappers.torch_sdpa_wrapper(q, k, v, scale=None)
    assert calls == []
    assert torch.equal(blocked, attention.blocked_attention(q, k, v).contiguous())

    q32, k32, v32 = qkv_views(1, 40, 2, 8, torch.float32)
    out32 = vit_attn_wrappers.torch_sdpa_wrapper(q32, k32, v32, scale=None)
    assert calls == [torch.float32]
    assert torch.equal(out32, original(q32, k32, v32).contiguous())

    # Grouped-query attention (fewer key heads) keeps PyTorch's kernel too.
    k_gqa, v_gqa = k[:, :, :1], v[:, :, :1]
    vit_attn_wrappers.torch_sdpa_wrapper(q, k_gqa, v_gqa, scale=None, enable_gqa=True)
    assert calls == [torch.float32, torch.bfloat16]


def test_turned_off_by_environment(monkeypatch):
    saved_function = vit_attn_wrappers.apply_sdpa
    monkeypatch.setenv(attention.ENV, "0")
    assert not attention.apply()
    assert vit_attn_wrappers.apply_sdpa is saved_function


@pytest.mark.parametrize(
    "setting, amx, expected",
    [
        (None, False, True),  # auto: blocked where PyTorch's bf16 kernel runs in float32 ...
        (None, True, False),  # ... and PyTorch's kernel where it has AMX tiles
        ("auto", True, False),
        ("1", True, True),
        ("0", False, False),
        ("off", False, False),
    ],
)
def test_auto_leaves_amx_cpus_to_pytorch(monkeypatch, setting, amx, expected):
    if setting is None:
        monkeypatch.delenv(attention.ENV, raising=False)
    else:
        monkeypatch.setenv(attention.ENV, setting)
    monkeypatch.setattr(attention, "amx_available", lambda: amx)
    assert attention.enabled() is expected
