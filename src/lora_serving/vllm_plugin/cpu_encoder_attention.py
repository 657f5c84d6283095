"""On CPU, encoder attention at bfloat16/float16 runs as blocks of two reduced-precision GEMMs
around a softmax, not as PyTorch's CPU flash-attention kernel.

Not a defect, a cost: vLLM's multimodal encoders (Whisper's audio encoder, Qwen-VL's vision
tower) call `F.scaled_dot_product_attention` (vit_attn_wrappers.apply_sdpa). On a CPU without
AMX, PyTorch's flash-attention kernel for bfloat16 does its products in float32 (MKL sgemm),
so bf16 buys nothing there while it makes the linear layers ~5x faster: serving whisper-base at
bf16, a 30 s window's encoder spent ~2/3 of its time in attention (py-spy: 31 % of the worker's
samples, the encoder's linear layers 14 %). Here each block of query rows takes one bf16 GEMM
for its scores (oneDNN/MKL bf16, float32 accumulation), a softmax, and one bf16 GEMM with the
values: one Whisper layer's attention (8 heads, 1500 frames) 60 ms -> 26-30 ms on one core.
Blocks are sized so that a block's scores stay in cache.

What changes: the scores are rounded to the model's dtype before the softmax, as the
probabilities are before the product with the values (the flash kernel keeps both in float32).
That is bf16 arithmetic, the trade an operator makes by choosing bf16; the word-error-rate bench
measures it. float32 (every exactness check) is untouched: it keeps PyTorch's kernel, as do
grouped-query attention and anything not on CPU.

On a CPU with AMX tiles, PyTorch's kernel does its bf16 products on AMX and is the faster one
(one Whisper layer: 23-27 ms against 55 ms blocked, Xeon with amx_bf16), so there nothing is
replaced. `LORA_SERVING_CPU_BLOCKED_ATTENTION`: `auto` (the default: blocked unless AMX), `1`
(blocked on any CPU), `0` (never).
"""

import importlib
import os
from typing import Any

import torch

WRAPPERS_MODULE = "vllm.v1.attention.ops.vit_attn_wrappers"
ENV = "LORA_SERVING_CPU_BLOCKED_ATTENTION"
REDUCED_DTYPES = (torch.bfloat16, torch.float16)
# One block's scores (heads x rows x keys) in bytes: 1 MiB stays in a core's L2 (measured
# best of 0.25-4 MiB for one Whisper layer).
BLOCK_BYTES = 1 << 20
MIN_BLOCK_ROWS = 16

_ORIGINAL: dict[str, Any] = {}


def amx_available() -> bool:
    return torch.cpu._is_amx_tile_supported()


def enabled() -> bool:
    choice = os.environ.get(ENV, "auto").strip().lower()
    if choice in ("0", "false", "no", "off"):
        return False
    if choice in ("1", "true", "yes", "on"):
        return True
    return not amx_available()


def block_rows(heads: int, keys: int, itemsize: int) -> int:
    """Query rows per block: as many as keep one block's scores within BLOCK_BYTES."""
    return max(MIN_BLOCK_ROWS, BLOCK_BYTES // max(1, heads * keys * itemsize))


def handles(q: torch.Tensor, k: torch.Tensor, enable_gqa: bool) -> bool:
    return (
        q.device.type == "cpu"
        and q.dtype in REDUCED_DTYPES
        and not enable_gqa
        and q.dim() == 4
        and q.shape[2] == k.shape[2]
    )


def blocked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """softmax(q k^T * scale) v for (batch, seq, heads, head_size) inputs, same shape out."""
    batch, rows, heads, size = q.shape
    keys = k.shape[1]
    scale = size**-0.5 if scale is None else scale
    # Each head's rows packed together (batch * heads, seq, size): the GEMMs are ~2x slower on
    # rows strided across heads, as vLLM's (seq, heads, size) views are. Keys enter the product
    # transposed, the layout the bf16 GEMM is fastest with.
    queries = (q * scale).transpose(1, 2).contiguous().view(batch * heads, rows, size)
    keys_t = k.transpose(1, 2).contiguous().view(batch * heads, keys, size).transpose(1, 2)
    values = v.transpose(1, 2).contiguous().view(batch * heads, keys, v.shape[-1])
    out = torch.empty(batch * heads, rows, v.shape[-1], dtype=q.dtype)
    step = block_rows(batch * heads, keys, q.element_size())
    for start in range(0, rows, step):
        scores = torch.bmm(queries[:, start : start + step], keys_t)
        torch.bmm(torch.softmax(scores, dim=-1), values, out=out[:, start : start + step])
    return out.view(batch, heads, rows, -1).transpose(1, 2)


def _apply_sdpa(q, k, v, scale=None, enable_gqa=False):
    """vLLM's apply_sdpa (inputs and output batch x seq x heads x head_size)."""
    if handles(q, k, enable_gqa) and not _ORIGINAL["zentorch"]:
        return blocked_attention(q, k, v, scale)
    return _ORIGINAL["apply_sdpa"](q, k, v, scale=scale, enable_gqa=enable_gqa)


def apply() -> bool:
    """Route vLLM's encoder attention through `_apply_sdpa`; True if this call did."""
    if not enabled():
        return False
    module = importlib.import_module(WRAPPERS_MODULE)
    current = getattr(module, "apply_sdpa", None)
    if current is None or not hasattr(module, "torch_sdpa_wrapper"):
        raise RuntimeError(f"{WRAPPERS_MODULE}.apply_sdpa is gone: re-check cpu_encoder_attention")
    if current is _apply_sdpa:
        return False
    from vllm.platforms import current_platform

    _ORIGINAL["apply_sdpa"] = current
    # vLLM's own choice on AMD with zentorch installed: its kernel, not PyTorch's.
    _ORIGINAL["zentorch"] = current_platform.is_zen_cpu() and hasattr(
        getattr(torch.ops, "zentorch", None), "zentorch_sdpa"
    )
    module.apply_sdpa = _apply_sdpa
    return True
