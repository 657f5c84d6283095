"""Whisper's encoder runs once per audio window, however many engine requests decode it.

One window can take several engine requests: the no-speech / language probe, the decode, its
temperature-fallback retries, and one request per beam and step of a beam search. vLLM 0.32
keeps no encoder output across requests of an encoder-decoder model (its
EncoderDecoderCacheManager never reports a hit), so each of them would run the 30 s encoder
again: vLLM's own beam search re-encodes at every step (upstream issue 49197).

The V1 model runner's encoder step (`_execute_mm_encoder`) is wrapped: an input whose identifier
was encoded recently is taken from a small LRU memo, inputs repeated within one step are encoded
once, and only the rest reach vLLM's code (which builds the tower-LoRA mapping for just those).
The identifier is vLLM's: the request's `multi_modal_uuids` entry, prefixed with the adapter
name when encoder LoRA is on, so an adapter's encoder output is never served to another. Our
Whisper task sends one fresh uuid per window of a request, so only requests of the same window
share an encoder output (never two users' requests that carry the same audio).

The memo holds at most `LORA_SERVING_ENCODER_MEMO_MB` (default 256) of encoder outputs, on the
device they were computed on. Counts of encoder runs and reuses are read through the worker
extension (`engine/lora_slots.py`). Model Runner V2 is left as it is (the GPU whisper_lora runs
the V1 runner).
"""

from collections import OrderedDict
from typing import Any

from .memo_budget import budget_from_env, tensor_bytes
from .wrapping import wrap_method

MEMO_ENV = "LORA_SERVING_ENCODER_MEMO_MB"
DEFAULT_MEMO_MB = 256
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
RUNNER_CLASS = "GPUModelRunner"


class EncoderMemo:
    """Encoder outputs by identifier, least recently used dropped first, within a byte budget."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[str, Any] = OrderedDict()
        self.bytes = 0
        self.runs = 0  # encoder inputs computed
        self.reuses = 0  # encoder inputs served from the memo or from a twin in the same step

    def get(self, key: str):
        output = self.entries.get(key)
        if output is not None:
            self.entries.move_to_end(key)
        return output

    def put(self, key: str, output) -> None:
        size = tensor_bytes(output)
        if size > self.budget_bytes or key in self.entries:
            return
        self.entries[key] = output
        self.bytes += size
        while self.bytes > self.budget_bytes:
            _, dropped = self.entries.popitem(last=False)
            self.bytes -= tensor_bytes(dropped)

    def counts(self) -> dict[str, int]:
        return {"encoder_runs": self.runs, "encoder_reuses": self.reuses, "entries": len(self)}

    def __len__(self) -> int:
        return len(self.entries)


def memo_budget_bytes() -> int:
    return budget_from_env(MEMO_ENV, DEFAULT_MEMO_MB)


def plan_encoder_step(
    scheduled: dict[str, list[int]], identifier, known: set[str]
) -> tuple[dict[str, list[int]], list[str]]:
    """(the inputs vLLM must encode this step, every input's identifier in vLLM's order).

    `identifier(req_id, input_id)` names an input; `known` holds the memo's identifiers. Of the
    inputs with one identifier, only the first unknown one is encoded.
    """
    to_encode: dict[str, list[int]] = {}
    seen = set(known)
    order = []
    for req_id, input_ids in scheduled.items():
        for input_id in input_ids:
            key = identifier(req_id, input_id)
            if key is None:
                continue
            order.append(key)
            if key not in seen:
                seen.add(key)
                to_encode.setdefault(req_id, []).append(input_id)
    return to_encode, order


def memo_of(runner) -> EncoderMemo | None:
    """The runner's memo; None for any model but Whisper (and with a zero budget)."""
    memo = runner.__dict__.get("_lora_serving_encoder_memo", False)
    if memo is False:
        config = runner.model_config
        is_whisper = config.is_encoder_decoder and (
            getattr(config.hf_config, "model_type", "") == "whisper"
        )
        budget = memo_budget_bytes()
        memo = EncoderMemo(budget) if is_whisper and budget > 0 else None
        runner._lora_serving_encoder_memo = memo
    return memo


def _execute_mm_encoder(self, scheduler_output):
    """vLLM's encoder step, with outputs reused across the requests of one window."""
    original = _ORIGINAL["_execute_mm_encoder"]
    memo = memo_of(self)
    scheduled = scheduler_output.scheduled_encoder_inputs
    if memo is None or not scheduled:
        return original(self, scheduler_output)

    def identifier(req_id: str, input_id: int) -> str | None:
        feature = self.requests[req_id].mm_features[input_id]
        return None if feature.data is None else feature.identifier

    to_encode, order = plan_encoder_step(scheduled, identifier, set(memo.entries))
    if to_encode:
        scheduler_output.scheduled_encoder_inputs = to_encode
        try:
            original(self, scheduler_output)
        finally:
            scheduler_output.scheduled_encoder_inputs = scheduled
    encoded = sum(len(ids) for ids in to_encode.values())
    memo.runs += encoded
    memo.reuses += len(order) - encoded
    # Memo hits first: storing this step's new outputs may push them out of the memo.
    found = {}
    for key in order:
        cached = self.encoder_cache.get(key)
        found[key] = cached if cached is not None else memo.get(key)
    for key in order:
        if key not in self.encoder_cache:
            self.encoder_cache[key] = found[key]
        elif memo.get(key) is None:
            # A copy: vLLM's output may be a view that keeps its whole batch alive.
            memo.put(key, found[key].clone())
    if len(order) > encoded and _tower_lora_on(self):
        _map_tower_rows(self, scheduler_output, [found[key] for key in order])
    return [found[key] for key in order]


def _tower_lora_on(runner) -> bool:
    return bool(runner.lora_config) and runner.lora_manager.supports_tower_connector_lora()


def _map_tower_rows(runner, scheduler_output, outputs: list) -> None:
    """Give the tower LoRA mapping a row for every scheduled input, reused ones included.

    The cross-attention kv_proj (a tower layer: whisper_encoder_lora) runs over the encoder
    outputs of every request new in this step, but vLLM mapped only the rows it encoded. Its
    encoder step is run once more over all inputs with the encoder itself stubbed out (it hands
    back the known outputs in order), so vLLM's own code builds the mapping.
    """
    model = runner.model
    remaining = iter(outputs)

    def known_outputs(**batch):
        count = _batch_size(batch)
        return [next(remaining) for _ in range(count)]

    model.embed_multimodal = known_outputs
    try:
        _ORIGINAL["_execute_mm_encoder"](runner, scheduler_output)
    finally:
        del model.embed_multimodal  # the class's method again


def _batch_size(batch: dict) -> int:
    features = batch.get("input_features")
    if features is None:
        raise RuntimeError(f"Whisper encoder batch without input_features: {sorted(batch)}")
    return len(features)


def encoder_counts(runner) -> dict[str, int]:
    memo = memo_of(runner)
    return memo.counts() if memo is not None else {"encoder_runs": -1, "encoder_reuses": -1}


_ORIGINAL: dict[str, Any] = {}


def apply() -> bool:
    """Wrap the V1 runner's encoder step; True if this call changed it."""
    import importlib

    runner_cls = getattr(importlib.import_module(RUNNER_MODULE), RUNNER_CLASS)
    return wrap_method(runner_cls, "_execute_mm_encoder", _execute_mm_encoder, _ORIGINAL)
