"""Whisper's decoding options beyond vLLM's SamplingParams: the `sampling_parameters` keys, their
defaults (`serving.task.decoding` in model.json) and what they resolve to for the engine.

- `suppress_tokens`: the model's non-speech symbols (generation_config `suppress_tokens`,
  openai-whisper's "-1" set) are never emitted. A list of token ids adds to that set (-1 stands
  for the set itself, as in openai-whisper); `[]` (or "") turns suppression off. openai-whisper's
  string form ("-1", "-1,1234") is accepted too.
- `suppress_blank`: at the first sampled position neither a blank nor end of text
  (generation_config `begin_suppress_tokens`); default true.

Defaults follow openai-whisper's and transformers' (both on).

openai-whisper's `transcribe()` quality loop (whisper_quality):
- `temperature`: one number, or a list tried in order while a window's result fails a check
  (default 0.0, 0.2, ..., 1.0);
- `compression_ratio_threshold` (2.4), `logprob_threshold` (-1.0), `no_speech_threshold` (0.6);
  null turns a check off;
- `condition_on_previous_text` (true): with timestamps, each window's decoder prompt carries the
  text before it.

Text given to the decoder, as faster-whisper builds its prompt (`WhisperModel.get_prompt`):
- `hotwords` (null): hint words or phrases, put after <|startofprev|> and before the previous
  text (`prompt`, or the windows said before with timestamps) in every window whose prompt has
  no `prefix`; its tokens are cut to half the context (as the previous text is);
- `prefix` (null): the start of the transcript, put after the task tokens of the first window
  only, so decoding continues from it; the transcript holds what follows it (openai-whisper's
  and faster-whisper's result tokens start after the prompt). Not with timestamps.

Beam search (whisper_beam): `beam_size` (1: greedy), `patience` (1.0), `length_penalty` (1.0),
`beam_rule` ("faster-whisper", the default: CTranslate2's search as faster-whisper runs it, with
openai-whisper's meaning of `patience`, also with timestamps; "transformers": equal to
transformers' `generate(num_beams=N)`).

Word timestamps (whisper_words, openai-whisper's `transcribe(word_timestamps=True)`):
`word_timestamps` (false; true implies `timestamps`), `prepend_punctuations` / `append_punctuations`
(openai-whisper's defaults), `word_timestamps_refine` (true: word edges trimmed to the speech
Silero VAD hears in them; false: openai-whisper's timings exactly).
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lora_serving.errors import ConfigError
from lora_serving.sampling import Field, check_field
from lora_serving.tasks import whisper_vad, whisper_words
from lora_serving.tasks.whisper_beam import BEAM_RULES, FASTER_WHISPER, MAX_BEAM_SIZE

MODEL_SET = -1  # openai-whisper's marker for the model's own non-speech set
DEFAULT_TEMPERATURES = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
DEFAULTS = {
    "suppress_tokens": [MODEL_SET],
    "suppress_blank": True,
    "temperature": DEFAULT_TEMPERATURES,
    "compression_ratio_threshold": 2.4,
    "logprob_threshold": -1.0,
    "no_speech_threshold": 0.6,
    "condition_on_previous_text": True,
    "beam_size": 1,
    "patience": 1.0,
    "length_penalty": 1.0,
    "beam_rule": FASTER_WHISPER,
    "hotwords": None,
    "prefix": None,
    "word_timestamps": False,
    "prepend_punctuations": whisper_words.PREPEND_PUNCTUATIONS,
    "append_punctuations": whisper_words.APPEND_PUNCTUATIONS,
    "word_timestamps_refine": True,
}
MAX_PUNCTUATIONS = 64  # characters in prepend_punctuations / append_punctuations
MAX_TEMPERATURES = 16

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
        "temperature": (
            (int, float, list),
            _valid_temperatures,
            f"a number in [0, 100] or a list of 1 to {MAX_TEMPERATURES} of them (tried in order)",
        ),
        "compression_ratio_threshold": _optional_number(lambda v: v > 0, "a number > 0"),
        "logprob_threshold": _optional_number(lambda v: v <= 0, "a number <= 0"),
        "no_speech_threshold": _optional_number(lambda v: 0 <= v <= 1, "a number in [0, 1]"),
        "condition_on_previous_text": ((bool,), lambda v: True, "true or false"),
        "beam_size": (
            (int,),
            lambda v: 1 <= v <= MAX_BEAM_SIZE,
            f"an integer in [1, {MAX_BEAM_SIZE}] (1: greedy)",
        ),
        "patience": ((int, float), lambda v: 1 <= v <= 10, "a number in [1, 10]"),
        "length_penalty": ((int, float), lambda v: 0 <= v <= 10, "a number in [0, 10]"),
        "beam_rule": ((str,), lambda v: v in BEAM_RULES, f"one of {', '.join(BEAM_RULES)}"),
        "hotwords": ((str, type(None)), lambda v: True, "text, or null (none)"),
        "prefix": ((str, type(None)), lambda v: True, "text, or null (none)"),
        "word_timestamps": ((bool,), lambda v: True, "true or false"),
        "prepend_punctuations": _punctuations(),
        "append_punctuations": _punctuations(),
        "word_timestamps_refine": ((bool,), lambda v: True, "true or false"),
    }


def _punctuations() -> Field:
    return (
        (str,),
        lambda v: len(v) <= MAX_PUNCTUATIONS,
        f"a string of at most {MAX_PUNCTUATIONS} punctuation characters",
    )


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _valid_temperatures(value) -> bool:
    values = value if isinstance(value, list) else [value]
    return 0 < len(values) <= MAX_TEMPERATURES and all(
        _is_number(v) and 0 <= v <= 100 for v in values
    )


def _optional_number(check, allowed: str) -> Field:
    return ((int, float, type(None)), lambda v: v is None or check(v), f"{allowed}, or null (off)")


def temperatures(value) -> tuple[float, ...]:
    """A checked `temperature` value -> the schedule (one number: no fallback)."""
    return tuple(float(v) for v in (value if isinstance(value, list) else [value]))


def decoding_defaults(task_options: dict[str, Any], vocab_size: int, source: str) -> dict:
    """DEFAULTS overridden by model.json's `serving.task.decoding`, each value checked."""
    given = task_options.get("decoding") or {}
    fields = task_fields(vocab_size)
    problems, checked = [], {}
    for key, value in given.items():
        if key not in fields:
            problems.append(f"unknown key serving.task.decoding.{key} (allowed: {sorted(fields)})")
            continue
        checked[key], allowed = check_field(fields[key], value)
        if allowed is not None:
            problems.append(f"serving.task.decoding.{key} must be {allowed}, got {value!r}")
    if problems:
        raise ConfigError(source, problems)
    return {**DEFAULTS, **checked}
