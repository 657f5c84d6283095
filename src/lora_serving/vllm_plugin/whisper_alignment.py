"""Whisper's alignment heads, read during a teacher-forced engine request (word timestamps).

vLLM's fused attention returns no attention weights. openai-whisper's word timings
(`whisper/timing.py`, find_alignment) need the cross-attention QK of a few "alignment heads"
(generation_config `alignment_heads`) over the decoded text, teacher-forced as
    <|startoftranscript|> <|xx|> <|task|> <|notimestamps|> text... <|endoftext|>
The serving side sends exactly that as one engine request per window (max_tokens 1), with the
request's own adapter, flagged by SamplingParams.extra_args[EXTRA_ARG]. For that request only,
in the layers holding alignment heads, this module computes q·kᵀ/√d for those heads from the q
the layer has just projected (with the request's LoRA) and the window's cross-attention K (from
whisper_cross_kv_memo's step, the K vLLM uses), then at the prompt's end openai-whisper's
matrix (softmax over the window's real encoder frames, standardised per head over tokens,
median filter of width 7, mean of heads) and each text token's probability among the text
tokens (the logits of the same pass). Nothing else in the batch changes: other requests' rows
are only read.

Return channel: the result waits in a bounded per-runner store, keyed by the request's own
`key`, until the serving side takes it with `collective_rpc(ALIGNMENT_METHOD, args=(key,))` (the
worker extension in engine/lora_slots.py), an ordinary vLLM utility call answered between engine
steps through vLLM's own channel: no files, the same on the CPU and GPU runners. Results never
taken (their requests cancelled) are dropped, oldest first, beyond MAX_RESULT_BYTES; a capture
whose request left the engine unfinished is dropped at the next step.

Eager mode only: under torch.compile (the GPU's decoder graph) the cross-attention layer runs
vLLM's code, nothing is captured, and the take answers with an error the serving side reports.
"""

import contextvars
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

EXTRA_ARG = "lora_serving_alignment"
# Finished alignments waiting to be taken, per runner: each is taken right after its request
# ends (one utility call); this bounds what requests cancelled in between leave behind. A
# whisper-base window's result is ~0.3 MiB (100 tokens x 750 frames), 2.6 MiB at most.
MAX_RESULT_BYTES = 96 * 1024 * 1024
_STORE_ATTR = "_lora_serving_alignment_store"
MEDIAN_FILTER_WIDTH = 7


@dataclass
class AlignmentSpec:
    """What the serving side asks for (the extra_args value, checked)."""

    key: str  # names the result
    heads: dict[int, list[int]]  # decoder layer -> its alignment heads
    frames: int  # encoder frames of the window's real audio (openai-whisper's num_frames // 2)
    text_from: int  # prompt index of <|notimestamps|> (= the sot sequence's length)
    eot: int  # <|endoftext|>; text tokens are below it

    @classmethod
    def from_extra_arg(cls, value: Any) -> "AlignmentSpec":
        heads: dict[int, list[int]] = {}
        for layer, head in value["heads"]:
            heads.setdefault(int(layer), []).append(int(head))
        return cls(
            str(value["key"]),
            heads,
            int(value["frames"]),
            int(value["text_from"]),
            int(value["eot"]),
        )


@dataclass
class Capture:
    """One flagged request's rows, gathered over the steps its prompt takes."""

    spec: AlignmentSpec
    prompt: list[int]
    keys: dict[int, Any] = field(default_factory=dict)  # layer -> K (heads, frames, head_dim)
    qk: dict[int, list] = field(default_factory=dict)  # layer -> [(heads, rows, frames)]
    hidden: list = field(default_factory=list)  # decoder output rows
    seen: int = 0  # prompt tokens gathered
    error: str | None = None
    req_id: str = ""


class AlignmentStore:
    def __init__(self):
        self.pending: dict[str, Capture] = {}  # by vLLM request id
        self.results: OrderedDict[str, dict] = OrderedDict()  # by spec key

    def put(self, key: str, result: dict) -> None:
        self.results[key] = result
        while len(self.results) > 1 and self.bytes() > MAX_RESULT_BYTES:
            self.results.popitem(last=False)

    def bytes(self) -> int:
        return sum(len(result.get("matrix", b"")) for result in self.results.values())

    def take(self, key: str) -> dict:
        result = self.results.pop(key, None)
        if result is None:
            return {
                "error": "no alignment was captured (word timestamps need the decoder in "
                "eager mode: enforce_eager in model.json)"
            }
        return result


_active: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "lora_serving_alignment_active", default=None
)


def store_of(runner) -> AlignmentStore:
    store = runner.__dict__.get(_STORE_ATTR)
    if store is None:
        store = AlignmentStore()
        setattr(runner, _STORE_ATTR, store)
    return store


def take(runner, key: str) -> dict:
    return store_of(runner).take(key)


# ---- runner: which rows of the step belong to flagged requests -------------------------------
def _model_forward(self, *args, **kwargs):
    """vLLM's runner forward, with the step's flagged requests (and their rows) made current."""
    store = self.__dict__.get(_STORE_ATTR)
    active = _flagged_rows(self) if _has_flagged(self) else []
    if store is not None:
        for req_id in [r for r in store.pending if r not in self.requests]:
            del store.pending[req_id]  # cancelled or failed before its prompt was read
    if not active:
        return _ORIGINAL["_model_forward"](self, *args, **kwargs)
    token = _active.set(active)
    try:
        hidden = _ORIGINAL["_model_forward"](self, *args, **kwargs)
    finally:
        _active.reset(token)
    if _is_tensor(hidden):
        for capture, start, end in active:
            capture.hidden.append(hidden[start:end].float())
            capture.seen += end - start
            if capture.seen >= len(capture.prompt):
                _finish(self, capture)
    return hidden


def _has_flagged(runner) -> bool:
    return any(_spec_value(runner.requests.get(r)) for r in runner.input_batch.req_ids)


def _spec_value(state):
    params = getattr(state, "sampling_params", None)
    extra = getattr(params, "extra_args", None) or {}
    return extra.get(EXTRA_ARG)


def _flagged_rows(runner) -> list[tuple[Capture, int, int]]:
    store = store_of(runner)
    starts = runner.query_start_loc.np
    active = []
    for index, req_id in enumerate(runner.input_batch.req_ids):
        state = runner.requests.get(req_id)
        value = _spec_value(state)
        if not value:
            continue
        capture = store.pending.get(req_id)
        if capture is None:
            if state.num_computed_tokens > 0:
                continue  # past its prompt (a flagged request generates one token)
            try:
                spec = AlignmentSpec.from_extra_arg(value)
            except (KeyError, TypeError, ValueError):
                continue
            capture = store.pending[req_id] = Capture(spec, list(state.prompt_token_ids or []))
        if capture.seen >= len(capture.prompt):
            continue
        capture.req_id = req_id
        active.append((capture, int(starts[index]), int(starts[index + 1])))
    return active


# ---- cross-attention: q·kᵀ of the alignment heads --------------------------------------------
def observe(attention, layer: int, q, kv, step) -> None:
    """Called by the cross-attention forward (whisper_cross_kv_memo) with the layer's q for the
    step's tokens and, in a step that brings encoder states, its packed K/V of those windows."""
    active = _active.get()
    if not active:
        return
    torch = _torch()
    heads_total, head_dim = attention.num_heads, attention.head_dim
    for capture, start, end in active:
        heads = capture.spec.heads.get(layer)
        if not heads or capture.error:
            continue
        if _window_of(step, kv, capture.req_id):
            index = step.owners.index(capture.req_id)
            first = sum(step.rows[:index])
            rows = step.rows[index]
            keys = kv[first : first + rows, : attention.kv_size].view(rows, heads_total, head_dim)
            frames = min(capture.spec.frames, rows)
            capture.keys[layer] = keys[:frames, heads].transpose(0, 1).float().clone()
        keys = capture.keys.get(layer)
        if keys is None:
            capture.error = "the window's cross-attention keys were not available"
            continue
        queries = q[start:end].view(end - start, heads_total, head_dim)[:, heads].transpose(0, 1)
        with torch.no_grad():
            scores = torch.matmul(queries.float(), keys.transpose(1, 2)) * head_dim**-0.5
        capture.qk.setdefault(layer, []).append(scores)


def _window_of(step, kv, req_id: str) -> bool:
    """Whether this step's K/V rows hold the request's window, laid out as `step` says."""
    return (
        kv is not None
        and step is not None
        and req_id in step.owners
        and sum(step.rows) == kv.shape[0]
    )


# ---- openai-whisper's find_alignment, the part that needs the model: QK -> the DTW matrix ---
def median_filter(x, filter_width: int):
    """openai-whisper's median filter along the last dimension (reflect padding)."""
    import torch.nn.functional as F

    pad_width = filter_width // 2
    if x.shape[-1] <= pad_width:
        return x
    ndim = x.ndim
    if ndim <= 2:
        x = x[None, None, :]
    x = F.pad(x, (pad_width, pad_width, 0, 0), mode="reflect")
    result = x.unfold(-1, filter_width, 1).sort()[0][..., pad_width]
    return result[0, 0] if ndim <= 2 else result


def alignment_matrix(weights, *, text_from: int):
    """(heads, prompt tokens, frames) QK of the window's real frames -> (1 + text tokens,
    frames): softmax over frames, standardised per head over tokens, median filter, mean of
    heads, without the sot sequence and <|endoftext|> rows (openai-whisper's find_alignment)."""
    import torch

    weights = weights.float().softmax(dim=-1)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = (weights - mean) / std
    weights = median_filter(weights, MEDIAN_FILTER_WIDTH)
    return weights.mean(dim=0)[text_from:-1]


def text_token_probabilities(hidden, embedding, prompt: Sequence[int], *, text_from: int, eot: int):
    """Each text token's probability among the text tokens (softmax over ids below <|endoftext|>)
    given the tokens before it: openai-whisper's `text_token_probs`."""
    text = list(prompt[text_from + 1 : -1])
    rows = hidden[text_from : text_from + len(text)].float()
    logits = rows @ embedding[:eot].float().T
    probabilities = logits.softmax(dim=-1)
    return [float(probabilities[i, token]) for i, token in enumerate(text)]


def _finish(runner, capture: Capture) -> None:
    store = store_of(runner)
    store.pending.pop(capture.req_id, None)
    spec = capture.spec
    if capture.error is None and set(capture.qk) != set(spec.heads):
        capture.error = "the alignment heads' layers did not run in eager mode"
    if capture.error is not None:
        store.put(spec.key, {"error": capture.error})
        return
    torch = _torch()
    with torch.no_grad():
        weights = torch.cat([torch.cat(capture.qk[layer], dim=1) for layer in sorted(spec.heads)])
        matrix = alignment_matrix(weights, text_from=spec.text_from)
        hidden = torch.cat(capture.hidden)
        embedding = runner.get_model().proj_out.weight
        probabilities = text_token_probabilities(
            hidden, embedding, capture.prompt, text_from=spec.text_from, eot=spec.eot
        )
    matrix = matrix.contiguous().numpy().astype("float32")
    store.put(
        spec.key,
        {"matrix": matrix.tobytes(), "shape": list(matrix.shape), "probabilities": probabilities},
    )


def _is_tensor(value) -> bool:
    return hasattr(value, "shape") and hasattr(value, "float")


def _torch():
    import torch

    return torch


_ORIGINAL: dict[str, Any] = {}


def apply() -> bool:
    """Wrap the V1 runner's _model_forward; True if this call changed it."""
    import importlib

    from .wrapping import wrap_method

    runner_module = importlib.import_module("vllm.v1.worker.gpu_model_runner")
    return wrap_method(runner_module.GPUModelRunner, "_model_forward", _model_forward, _ORIGINAL)
