"""Rows without an adapter (LoRA index -1) get exactly zero LoRA delta on CPU.

Defect (vLLM 0.32): the torch LoRA ops in `vllm/lora/ops/torch_ops/lora_ops.py` gather the stacked
adapter weights with each token's slot index. A request without an adapter has index -1, which
PyTorch reads as "the last slot", so a base request batched with adapter requests silently gets
the last slot's adapter. Upstream fixes: vllm-project/vllm PRs 48421 and 49656 (open).

Fix depth: `PunicaWrapperCPU` runs every LoRA path through these six ops (linear shrink, expand,
expand_slice; embeddings; logits; full linear), and every CPU wrapper instance uses it: the
language model's and the multimodal tower's and connector's. Replacing the ops in the three
namespaces that hold them covers all of those callers at once. The Triton kernels used on GPU
skip -1 rows themselves and never call these ops, so they are left alone.

The replacements keep upstream's signatures (names included, so `apply` can check them) and its
shape handling; the only change is that rows whose index is -1 produce an exact zero.
"""

import importlib
import inspect
from collections.abc import Callable

import torch

# Every namespace that binds the ops; PunicaWrapperCPU calls them through the last one.
PATCHED_MODULES = (
    "vllm.lora.ops.torch_ops.lora_ops",
    "vllm.lora.ops.torch_ops",
    "vllm.lora.punica_wrapper.punica_cpu",
)
UPSTREAM_OPS_MODULE = PATCHED_MODULES[0]


GATHER_MAX_ROWS = 32


def _lora_product(
    inputs: torch.Tensor,
    stacked_weights: torch.Tensor,
    lora_indices: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Per row: inputs[i] @ stacked_weights[lora_indices[i]].T, or zeros where the index is -1.

    One matrix product per adapter slot in use, over that slot's rows. Upstream instead gathers a
    copy of the weights for every row ([rows, out, in]); on a prefill (a Whisper encoder's 1500
    frames, an image's patches) that copy costs more than the model's own matmul."""
    if stacked_weights.ndim == 4:  # stacked as [slots, 1, out, in]
        stacked_weights = stacked_weights.squeeze(dim=1)
    inputs = inputs.to(dtype=dtype)
    # A few rows (decoding): the gathered copy is small and one einsum beats a loop over slots.
    # Rows and indices of different counts: upstream's broadcasting of a single row.
    if inputs.shape[0] <= GATHER_MAX_ROWS or lora_indices.shape[0] != inputs.shape[0]:
        return _gathered_product(inputs, stacked_weights, lora_indices, dtype)
    product = inputs.new_zeros((inputs.shape[0], stacked_weights.shape[-2]))
    for slot in torch.unique(lora_indices).tolist():
        if slot < 0:  # no adapter: exact zeros, whatever the slot buffers hold
            continue
        weights = stacked_weights[slot].to(dtype=dtype)
        if not weights.any():  # a module this adapter does not train: its slot is zeros
            continue
        rows = (lora_indices == slot).nonzero().squeeze(1)
        if rows.numel() == inputs.shape[0]:
            torch.matmul(inputs, weights.T, out=product)
        else:
            product.index_copy_(0, rows, inputs.index_select(0, rows) @ weights.T)
    return product


def _gathered_product(inputs, stacked_weights, lora_indices, dtype) -> torch.Tensor:
    """Upstream's way (a weight copy per row): for a few rows, and for rows and indices of
    different counts."""
    weights = stacked_weights[lora_indices.clamp(min=0)].to(dtype=dtype)
    product = torch.einsum("bi, boi -> bo", inputs, weights)
    # masked_fill, not a multiply: a zero must stay zero even if a slot holds inf or NaN.
    return product.masked_fill_(~(lora_indices >= 0).unsqueeze(-1), 0)


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,  # upstream's name; these are the LoRA A weights
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
):
    outputs = _lora_product(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
):
    outputs = _lora_product(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    # Upstream's shape handling: one output row broadcasts over all rows, and the adapter and
    # the model may pad the output dimension differently.
    limit = 1 if outputs.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    common_len = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
):
    outputs = _lora_product(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


def sgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    scaling: float,
):
    token_indices = torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)
    bgmv_shrink(inputs, lora_a_weights, output_tensor, token_indices, scaling)


def sgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    add_inputs: bool = False,
):
    token_indices = torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)
    bgmv_expand(inputs, lora_b_weights, output_tensor, token_indices, add_inputs)


def sgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = False,
):
    token_indices = torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)
    bgmv_expand_slice(
        inputs, lora_b_weights, output_tensor, token_indices, slice_offset, slice_size, add_inputs
    )


FIXED_OPS: dict[str, Callable] = {
    op.__name__: op
    for op in (
        bgmv_shrink,
        bgmv_expand,
        bgmv_expand_slice,
        sgmv_shrink,
        sgmv_expand,
        sgmv_expand_slice,
    )
}


def _parameters(function: Callable) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def _unexpected_binding(module_name: str, op_name: str, current: object) -> str | None:
    """Why `current` is neither our fix nor the upstream op it was written against, or None."""
    fixed = FIXED_OPS[op_name]
    if current is fixed:
        return None
    if not callable(current) or getattr(current, "__module__", None) != UPSTREAM_OPS_MODULE:
        return f"{module_name}.{op_name} is {current!r}, not vLLM's torch op"
    if _parameters(current) != _parameters(fixed):
        return f"{module_name}.{op_name} has signature {inspect.signature(current)}"
    return None


def apply() -> bool:
    """Bind the fixed ops everywhere vLLM holds them; True if anything changed, False if done.

    Raises RuntimeError, listing every mismatch, when the code to patch is not shaped as the fix
    expects (an op moved, changed its signature, or was replaced by someone else).
    """
    problems = []
    modules = []
    for module_name in PATCHED_MODULES:
        try:
            modules.append(importlib.import_module(module_name))
        except ImportError as error:
            problems.append(f"cannot import {module_name} ({error})")
    pending = []
    for module in modules:
        for op_name, fixed in FIXED_OPS.items():
            current = getattr(module, op_name, None)
            problem = _unexpected_binding(module.__name__, op_name, current)
            if problem:
                problems.append(problem)
            elif current is not fixed:
                pending.append((module, op_name))
    if problems:
        raise RuntimeError(
            "lora_serving cannot apply its CPU mixed-batch LoRA fix to this vLLM: "
            + "; ".join(problems)
        )
    for module, op_name in pending:
        setattr(module, op_name, FIXED_OPS[op_name])
    return bool(pending)


def is_applied() -> bool:
    """Whether the CPU punica wrapper currently runs the fixed ops."""
    punica_cpu = importlib.import_module(PATCHED_MODULES[-1])
    return all(getattr(punica_cpu, name, None) is op for name, op in FIXED_OPS.items())
