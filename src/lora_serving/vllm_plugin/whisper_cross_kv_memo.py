"""Whisper's cross-attention keys and values are computed once per audio window and layer.

Every engine request of a window (the no-speech probe, the decode, its temperature retries, one
request per beam and step of a beam search) gets its own cross-attention KV cache, filled by
its first step: each decoder layer's `kv_proj` over the window's 1500 encoder frames. For
whisper-base in float32 that is ~9 GFLOP, ~95 ms on one core, per request: most of a beam
search's time (beam 5 ran 5x slower than faster-whisper's, which keeps one encoder output and
one cross K/V per window). whisper_encoder_memo already reuses the window's encoder output; this
reuses what `kv_proj` made of it.

How: the V1 runner's encoder step (`_execute_mm_encoder`, wrapped after the encoder memo's
wrapper) notes the step's windows (the request's adapter and vLLM's encoder-input identifier,
our per-window uuid) and the list of encoder outputs it hands to the model.
`WhisperModel.forward`, given that very list, makes the step current for its decoder layers;
each `WhisperCrossAttention` then takes its K/V from the memo when every window of the step is
there, and otherwise runs `kv_proj` over all rows as vLLM does (the tower LoRA mapping covers
all rows) and keeps the new windows' slices; in a step without adapters, the base projection
runs once per window (a window's probe and decode often start in the same step).
The values are those `kv_proj` computed for the window's first request, so a request decodes
exactly as it would have.

Only in eager mode: under torch.compile (the GPU's decoder graph) the layer runs vLLM's code.
The memo holds at most `LORA_SERVING_CROSS_KV_MEMO_MB` (default 256; whisper-base float32 takes
36 MiB per window), least recently used windows dropped first, never one the current step uses.
"""

import contextvars
import importlib
import inspect
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from . import whisper_alignment
from .memo_budget import budget_from_env, tensor_bytes
from .wrapping import wrap_method

MEMO_ENV = "LORA_SERVING_CROSS_KV_MEMO_MB"
DEFAULT_MEMO_MB = 256
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
RUNNER_CLASS = "GPUModelRunner"
WHISPER_MODULE = "vllm.model_executor.models.whisper"
# vLLM's WhisperCrossAttention.forward, which ours repeats with kv_proj's call replaced.
UPSTREAM_CROSS_KV_LINE = "kv, _ = self.kv_proj(encoder_hidden_states)"
_MEMO_ATTR = "_lora_serving_cross_kv_memo"
_LAYER_ATTR = "_lora_serving_cross_kv_layer"


class CrossKVMemo:
    """Cross-attention K/V by window identifier and layer index, within a byte budget."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self.windows: OrderedDict[str, dict[int, Any]] = OrderedDict()
        self.bytes = 0
        self.runs = 0  # (request window, layer) pairs whose K/V kv_proj computed
        self.reuses = 0  # (request window, layer) pairs served from the memo
        self.pending: Step | None = None  # noted by the encoder step, taken by the forward

    def get(self, key: str, layer: int):
        kv = self.windows.get(key, {}).get(layer)
        if kv is not None:
            self.windows.move_to_end(key)
        return kv

    def put(self, key: str, layer: int, kv, keep: set[str]) -> None:
        """Keep `kv`, dropping the least recently used windows outside `keep`; if only `keep`'s
        windows are left and it still does not fit, it is not kept."""
        layers = self.windows.setdefault(key, {})
        if layer in layers:
            return
        size = tensor_bytes(kv)
        layers[layer] = kv
        self.bytes += size
        self.windows.move_to_end(key)
        for old in list(self.windows):
            if self.bytes <= self.budget_bytes:
                return
            if old not in keep:
                self._drop(old)
        if self.bytes > self.budget_bytes:
            del layers[layer]
            self.bytes -= size
            if not layers:
                del self.windows[key]

    def _drop(self, key: str) -> None:
        self.bytes -= sum(tensor_bytes(kv) for kv in self.windows.pop(key).values())

    def counts(self) -> dict[str, int]:
        return {"cross_kv_runs": self.runs, "cross_kv_reuses": self.reuses}


@dataclass
class Step:
    """One engine step's windows, in the order of the encoder outputs handed to the model."""

    memo: CrossKVMemo
    keys: list[str]
    rows: list[int]  # encoder frames per window
    outputs: list  # the very list the runner passes to the model's forward
    base_only: bool = False  # no request of the step has an adapter
    owners: list[str] = field(default_factory=list)  # vLLM request id of each window


def memo_budget_bytes() -> int:
    return budget_from_env(MEMO_ENV, DEFAULT_MEMO_MB)


def cross_kv(kv_proj, encoder_states, step: Step | None, layer: int):
    """The layer's packed K/V for `encoder_states` (all windows of the step, concatenated)."""
    if step is None or sum(step.rows) != encoder_states.shape[0]:
        return kv_proj(encoder_states)[0]
    memo = step.memo
    known = [memo.get(key, layer) for key in step.keys]
    if all(kv is not None for kv in known):
        memo.reuses += len(known)
        return _torch().cat(known)  # a new tensor: the attention may not write into the memo
    distinct = len(set(step.keys))
    if step.base_only and distinct < len(step.keys):
        kv = _project_each_window_once(kv_proj, encoder_states, step)
        memo.runs += distinct
        memo.reuses += len(step.keys) - distinct
    else:
        kv, _ = kv_proj(encoder_states)
        memo.runs += len(known)
    keep, start = set(step.keys), 0
    for key, rows in zip(step.keys, step.rows, strict=True):
        if memo.get(key, layer) is None:
            memo.put(key, layer, kv[start : start + rows].clone(), keep)
        start += rows
    return kv


def _project_each_window_once(kv_proj, encoder_states, step: Step):
    """A window's probe and decode often start in one step. Without adapters (LoRA adds exactly
    zero to such rows) the base projection runs over each window's rows once, and its result is
    repeated for the window's other requests. With adapters kv_proj must see every row: the
    tower LoRA mapping has one entry per row."""
    torch = _torch()
    base = getattr(kv_proj, "base_layer", kv_proj)  # the LoRA wrapper's own linear layer
    first: dict[str, tuple[int, int]] = {}
    start = 0
    for key, rows in zip(step.keys, step.rows, strict=True):
        first.setdefault(key, (start, rows))
        start += rows
    projected = base(torch.cat([encoder_states[s : s + n] for s, n in first.values()]))[0]
    by_key, start = {}, 0
    for key, (_, rows) in first.items():
        by_key[key] = projected[start : start + rows]
        start += rows
    return torch.cat([by_key[key] for key in step.keys])


def _torch():
    import torch

    return torch


_current_step: contextvars.ContextVar[Step | None] = contextvars.ContextVar(
    "lora_serving_cross_kv_step", default=None
)


# ---- vLLM wrappers ---------------------------------------------------------------------------
def memo_of(runner) -> CrossKVMemo | None:
    """The memo of the runner's Whisper model, created on first use; None for other models, a
    zero budget, or a model that is not laid out as expected."""
    model = runner.__dict__.get("_lora_serving_cross_kv_model", False)
    if model is False:
        budget = memo_budget_bytes()
        model = _whisper_model(runner) if budget > 0 else None
        if model is not None:
            setattr(model, _MEMO_ATTR, CrossKVMemo(budget))
        runner._lora_serving_cross_kv_model = model
    return None if model is None else getattr(model, _MEMO_ATTR)


def _whisper_model(runner):
    config = runner.model_config
    if not (config.is_encoder_decoder and getattr(config.hf_config, "model_type", "") == "whisper"):
        return None
    whisper = importlib.import_module(WHISPER_MODULE)
    found, layer = None, 0
    for module in runner.get_model().modules():
        if isinstance(module, whisper.WhisperModel) and found is None:
            found = module
        elif isinstance(module, whisper.WhisperCrossAttention):
            setattr(module, _LAYER_ATTR, layer)
            layer += 1
    return found if layer else None


def _execute_mm_encoder(self, scheduler_output):
    """The encoder step (vLLM's, or the encoder memo's around it), noting the step's windows."""
    outputs = _ORIGINAL["_execute_mm_encoder"](self, scheduler_output)
    memo = memo_of(self)
    if memo is None:
        return outputs
    memo.pending = None
    keys, adapters, owners = [], set(), []
    for req_id, input_ids in scheduler_output.scheduled_encoder_inputs.items():
        request = self.requests[req_id]
        adapter = request.lora_request.lora_name if request.lora_request else ""
        adapters.add(adapter)
        for input_id in input_ids:
            feature = request.mm_features[input_id]
            if feature.identifier is None:
                return outputs
            keys.append(f"{adapter}|{feature.identifier}")
            owners.append(req_id)
    if len(keys) == len(outputs):
        rows = [int(output.shape[0]) for output in outputs]
        memo.pending = Step(memo, keys, rows, outputs, adapters == {""}, owners)
    return outputs


def _whisper_model_forward(self, input_ids, positions, encoder_outputs):
    """vLLM's, with this step's windows made current for the cross-attention layers."""
    memo = self.__dict__.get(_MEMO_ATTR)
    step = None
    if memo is not None and memo.pending is not None:
        if memo.pending.outputs is encoder_outputs:
            step = memo.pending
        memo.pending = None
    token = _current_step.set(step)
    try:
        return _ORIGINAL["forward"](self, input_ids, positions, encoder_outputs)
    finally:
        _current_step.reset(token)


def _cross_attention_forward(self, hidden_states, encoder_hidden_states):
    """vLLM's WhisperCrossAttention.forward, with kv_proj's K/V taken from the memo."""
    torch = _torch()
    q, _ = self.q_proj(hidden_states)
    # Encoder hidden states are only given in a request's first step; later steps read the
    # keys and values from the KV cache.
    compiling = torch.compiler.is_compiling() or _LAYER_ATTR not in self.__dict__
    kv = None
    if encoder_hidden_states is not None:
        if compiling:
            kv, _ = self.kv_proj(encoder_hidden_states)
        else:
            layer = self.__dict__[_LAYER_ATTR]
            kv = cross_kv(self.kv_proj, encoder_hidden_states, _current_step.get(), layer)
        k, v = kv.split([self.kv_size, self.kv_size], dim=-1)
    else:
        k = v = None
    if not compiling:  # word timestamps: the alignment heads of a flagged request
        whisper_alignment.observe(self, self.__dict__[_LAYER_ATTR], q, kv, _current_step.get())
    attn_output = self.attn(q, k, v)
    output, _ = self.out_proj(attn_output)
    return output


_ORIGINAL: dict[str, Any] = {}


def apply() -> bool:
    """Wrap the V1 runner's encoder step, WhisperModel.forward and WhisperCrossAttention's
    forward; True if this call changed them. Apply after whisper_encoder_memo."""
    runner_cls = getattr(importlib.import_module(RUNNER_MODULE), RUNNER_CLASS)
    whisper = importlib.import_module(WHISPER_MODULE)
    cross_cls = whisper.WhisperCrossAttention
    replace_cross = cross_cls.__dict__.get("forward") is not _cross_attention_forward
    if replace_cross:
        source = inspect.getsource(cross_cls.forward)
        if UPSTREAM_CROSS_KV_LINE not in source or "self.attn(q, k, v)" not in source:
            raise RuntimeError(
                "vLLM's WhisperCrossAttention.forward has changed: re-check whisper_cross_kv_memo"
            )
    changed = wrap_method(runner_cls, "_execute_mm_encoder", _execute_mm_encoder, _ORIGINAL)
    changed |= wrap_method(whisper.WhisperModel, "forward", _whisper_model_forward, _ORIGINAL)
    if replace_cross:  # replaced, not wrapped: its kv_proj call is what changes
        _ORIGINAL["cross_attention_forward"] = cross_cls.forward
        cross_cls.forward = _cross_attention_forward
    return changed or replace_cross
