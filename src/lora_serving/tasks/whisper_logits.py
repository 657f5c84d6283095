"""Whisper's decoding rules on the logits, as one vLLM logits processor.

openai-whisper, faster-whisper and transformers' `generate()` never let Whisper emit its
non-speech symbols (`suppress_tokens`: `( ) [ ] ♪ ...`, the model's generation_config list) and
never let it start with a blank or end of text (`begin_suppress_tokens` at the first sampled
position: openai-whisper's `suppress_blank`). vLLM applies neither. The rules go in this order,
the order of both references' logits processors: suppression at the first position, suppression
everywhere, then the timestamp rules (whose "timestamps are likelier than text" test sees the
suppressed logits).

vLLM loads `WhisperLogitsRules` in its engine process (engine argument `logits_processors`) and
applies it only to requests whose `SamplingParams.extra_args` carry EXTRA_ARG.
"""

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from lora_serving.tasks.whisper_timestamps import TimestampRules

EXTRA_ARG = "whisper_rules"
PROCESSOR = "lora_serving.tasks.whisper_logits:WhisperLogitsRules"


@dataclass(frozen=True)
class DecodingRules:
    """One request's rules; what travels in `extra_args` is `as_extra_arg()`."""

    suppress: tuple[int, ...] = ()  # at every position
    suppress_at_begin: tuple[int, ...] = ()  # at the first sampled position only
    timestamps: TimestampRules | None = None
    # Tokens of this decoding already in the decoder prompt (a beam step's beam): the rules
    # read them as sampled, so the first position is after them.
    sampled_before: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.suppress and not self.suppress_at_begin and self.timestamps is None

    def as_extra_arg(self) -> dict[str, Any]:
        timestamps = self.timestamps
        return {
            "suppress": list(self.suppress),
            "suppress_at_begin": list(self.suppress_at_begin),
            "timestamps": None
            if timestamps is None
            else {"timestamp_begin": timestamps.timestamp_begin, "eot": timestamps.eot},
            "sampled_before": list(self.sampled_before),
        }

    @classmethod
    def from_extra_arg(cls, value: dict[str, Any]) -> "DecodingRules":
        unknown = set(value) - {"suppress", "suppress_at_begin", "timestamps", "sampled_before"}
        if unknown:
            raise ValueError(f"unknown {EXTRA_ARG} keys {sorted(unknown)}")
        timestamps = value.get("timestamps")
        return cls(
            suppress=tuple(int(t) for t in value.get("suppress") or ()),
            suppress_at_begin=tuple(int(t) for t in value.get("suppress_at_begin") or ()),
            timestamps=None if timestamps is None else TimestampRules(**timestamps),
            sampled_before=tuple(int(t) for t in value.get("sampled_before") or ()),
        )

    @cached_property
    def _suppress_index(self) -> torch.Tensor:
        return torch.tensor(self.suppress, dtype=torch.long)

    @cached_property
    def _begin_index(self) -> torch.Tensor:
        return torch.tensor(self.suppress_at_begin, dtype=torch.long)

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        if self.sampled_before:
            output_ids = [*self.sampled_before, *output_ids]
        if not output_ids and self.suppress_at_begin:
            logits[self._begin_index.to(logits.device)] = -math.inf
        if self.suppress:
            logits[self._suppress_index.to(logits.device)] = -math.inf
        if self.timestamps is not None:
            logits = self.timestamps(output_ids, logits)
        return logits


class WhisperLogitsRules(AdapterLogitsProcessor):
    """Applies DecodingRules to the requests that carry them (vLLM v1 logits processor)."""

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        value = (sampling_params.extra_args or {}).get(EXTRA_ARG)
        if value is not None:
            DecodingRules.from_extra_arg(value)  # a wrong key fails the request, not the step

    def is_argmax_invariant(self) -> bool:
        return False  # it changes what greedy decoding picks

    def new_req_logits_processor(self, params) -> DecodingRules | None:
        value = (params.extra_args or {}).get(EXTRA_ARG)
        return None if value is None else DecodingRules.from_extra_arg(value)
