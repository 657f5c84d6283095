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
) -> torch.Tensor | None:
    """Per row: inputs[i] @ stacked_weights[lora_indices[i]].T, or zeros where the index is -1.

    None (over GATHER_MAX_ROWS rows) when every row's product is exactly zero: no row has an
    adapter, or the adapters of the rows do not train this module (their slots hold zeros). That
    is every encoder layer of a Whisper window whose adapter is decoder-only; the callers then
    write or add nothing instead of a [rows, out] block of zeros.

    Over GATHER_MAX_ROWS rows: one matrix product per adapter slot in use, over that slot's rows.
    Upstream instead gathers a copy of the weights for every row ([rows, out, in]); on a prefill
    (a Whisper encoder's 1500 frames, an image's patches) that copy costs more than the model's
    own matmul."""
    if stacked_weights.ndim == 4:  # stacked as [slots, 1, out, in]
        stacked_weights = stacked_weights.squeeze(dim=1)
    inputs = inputs.to(dtype=dtype)
    # A few rows (decoding): one product over all slots beats a loop over the slots in use;
    # every op here is paid per adapted layer per decode step, so none is spent on finding
    # untrained slots.
    if inputs.shape[0] <= GATHER_MAX_ROWS or lora_indices.shape[0] != inputs.shape[0]:
        return _gathered_product(inputs, stacked_weights, lora_indices, dtype)
    # A slot of zeros is a module this adapter does not train (vLLM zeroes unused slots).
    trained = stacked_weights.flatten(start_dim=1).any(dim=1).tolist()
    slots = [slot for slot in torch.unique(lora_indices).tolist() if slot >= 0 and trained[slot]]
    if not slots:
        return None
    product = inputs.new_zeros((inputs.shape[0], stacked_weights.shape[-2]))
    for slot in slots:
        weights = stacked_weights[slot].to(dtype=dtype)
        rows = (lora_indices == slot).nonzero().squeeze(1)
        if rows.numel() == inputs.shape[0]:
            torch.matmul(inputs, weights.T, out=product)
        else:
            product.index_copy_(0, rows, inputs.index_select(0, rows) @ weights.T)
    return product


def _gathered_product(inputs, stacked_weights, lora_indices, dtype) -> torch.Tensor:
    """For a few rows, and for rows and indices of different counts (upstream broadcasts one row
    over all indices, or one index over all rows): every row times every slot in one matrix
    product, then each row's own slot picked. Upstream copies a slot's weights for every row and
    multiplies row by row; at a decode step of 16 rows that took 3-5x as long (439 vs 91 us for
    a 2048-wide expand on one core). The extra products are few (max_loras slots, rank-sized),
    and a slot's values, even inf or NaN, only reach the rows that use it."""
    slots, out_features = stacked_weights.shape[0], stacked_weights.shape[-2]
    all_slots = stacked_weights.reshape(slots * out_features, -1).to(dtype=dtype)
    product = torch.mm(inputs, all_slots.T).view(inputs.shape[0], slots, out_features)
    count = max(inputs.shape[0], lora_indices.shape[0])
    if inputs.shape[0] == count:
        row_ids = torch.arange(count)
    else:  # one row for every index
        row_ids = torch.zeros(count, dtype=torch.long)
    picked = product[row_ids, lora_indices.clamp(min=0).expand(count)]
    # masked_fill, not a multiply: a zero must stay zero even if a slot holds inf or NaN.
    return picked.masked_fill_(~(lora_indices >= 0).expand(count).unsqueeze(-1), 0)


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,  # upstream's name; these are the LoRA A weights
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
):
    outputs = _lora_product(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None:
        output_tensor[:, : lora_b_weights.shape[-2]] = 0
    else:
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
    common_len = min(lora_b_weights.shape[-2], output_tensor.shape[1])
    if outputs is None:
        if not add_inputs:
            output_tensor[:, :common_len] = 0
        return
    limit = 1 if outputs.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
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
    if outputs is None:
        if not add_inputs:
            output_tensor[:, slice_offset : slice_offset + slice_size] = 0
        return
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


def _token_indices(lora_indices, seq_lens, batches: int, token_nums: int) -> torch.Tensor:
    """Each token's slot from each sequence's; a decode step (one token per sequence) needs no
    copy."""
    if batches == token_nums:
        return lora_indices
    return torch.repeat_interleave(lora_indices, seq_lens)


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
    token_indices = _token_indices(lora_indices_tensor, seq_len_tensor, batches, token_nums)
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
    token_indices = _token_indices(lora_indices_tensor, seq_len_tensor, batches, token_nums)
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
    token_indices = _token_indices(lora_indices_tensor, seq_len_tensor, batches, token_nums)
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
