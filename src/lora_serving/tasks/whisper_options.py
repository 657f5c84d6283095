"""Whisper's decoding options beyond vLLM's SamplingParams: the `sampling_parameters` keys, their
defaults (`serving.task.decoding` in model.json) and what they resolve to for the engine.

- `suppress_tokens`: the model's non-speech symbols (generation_config `suppress_tokens`,
  openai-whisper's "-1" set) are never emitted. A list of token ids adds to that set (-1 stands
  for the set itself, as in openai-whisper); `[]` (or "") turns suppression off. openai-whisper's
  string form ("-1", "-1,1234") is accepted too.
- `suppress_blank`: at the first sampled position neither a blank nor end of text
  (generation_config `begin_suppress_tokens`); default true.

Defaults follow openai-whisper's and transformers' (both on).
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lora_serving.errors import ConfigError
from lora_serving.sampling import Field
from lora_serving.tasks import whisper_vad

MODEL_SET = -1  # openai-whisper's marker for the model's own non-speech set
DEFAULTS = {"suppress_tokens": [MODEL_SET], "suppress_blank": True}

DEFAULTS |= whisper_vad.DEFAULTS  # vad_filter, vad_parameters: voice activity detection


@dataclass(frozen=True)
class SuppressionLists:
    """The model's own lists (its generation_config.json; empty when it has none)."""

    non_speech: tuple[int, ...] = ()
    at_begin: tuple[int, ...] = ()

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> "SuppressionLists":
        path = Path(model_dir) / "generation_config.json"
        if not path.is_file():
            return cls()
        config = json.loads(path.read_text())
        return cls(
            non_speech=tuple(config.get("suppress_tokens") or ()),
            at_begin=tuple(config.get("begin_suppress_tokens") or ()),
        )

    def resolve(self, options: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(suppressed everywhere, suppressed at the first position) for a request's options."""
        ids = token_ids(options["suppress_tokens"])
        everywhere = tuple(sorted(set(self.non_speech) | {i for i in ids if i != MODEL_SET}))
        return (everywhere if ids else ()), (self.at_begin if options["suppress_blank"] else ())


def token_ids(value: list | str) -> list[int]:
    """A checked `suppress_tokens` value -> its ids (-1 included)."""
    if isinstance(value, str):
        return [int(part) for part in value.split(",") if part.strip()]
    return list(value)


def task_fields(vocab_size: int) -> dict[str, Field]:
    def valid_ids(value) -> bool:
        try:
            ids = token_ids(value)
        except ValueError:
            return False
        plain = all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        return plain and all(i == MODEL_SET or 0 <= i < vocab_size for i in ids)

    return whisper_vad.task_fields() | {
        "suppress_tokens": (
            (list, str),
            valid_ids,
            f"a list of token ids in [0, {vocab_size}) (-1: the model's non-speech set), "
            'or [] for none (openai-whisper\'s "-1,..." string form too)',
        ),
        "suppress_blank": ((bool,), lambda v: True, "true or false"),
    }


def decoding_defaults(task_options: dict[str, Any], vocab_size: int, source: str) -> dict:
    """DEFAULTS overridden by model.json's `serving.task.decoding`, each value checked."""
    given = task_options.get("decoding") or {}
    fields = task_fields(vocab_size)
    problems = []
    for key, value in given.items():
        if key not in fields:
            problems.append(f"unknown key serving.task.decoding.{key} (allowed: {sorted(fields)})")
        elif not isinstance(value, fields[key][0]) or not fields[key][1](value):
            problems.append(f"serving.task.decoding.{key} must be {fields[key][2]}, got {value!r}")
    if problems:
        raise ConfigError(source, problems)
    return {**DEFAULTS, **given}
