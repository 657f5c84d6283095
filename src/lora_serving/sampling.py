"""`sampling_parameters` JSON (Triton vllm_backend's keys) -> keyword arguments of SamplingParams.

Every problem is reported in one InvalidRequest naming the key and what is allowed, so a client
fixes its request once instead of once per key. A task may accept keys of its own
(`task_fields`, e.g. Whisper's suppress_tokens, or GENERATION_FIELDS for free text generation);
they come back in the same dict and the task takes its own out before the rest becomes
SamplingParams. Every other SamplingParams field of vLLM 0.32 is refused with the reason
(NOT_OFFERED), so no key is ever silently ignored.

Values arrive as vllm_backend clients send them: JSON values, or strings converted by the
field's type ({"max_tokens": "16", "temperature": "0"}; "false" is False, unlike vllm_backend's
bool("false")); a list or object field also takes its JSON text (vllm_backend's
`structured_outputs` is a JSON string).

A Field is (accepted python types, check on the value, description of the valid range) and may
carry a fourth element: a conversion applied to the checked value (JSON object keys -> ints).
"""

import json
import math
from typing import Any

from lora_serving.errors import InvalidRequest

# key -> (accepted python types, check on the value, human description of the valid range
#         [, conversion of the checked value])
Field = tuple[tuple[type, ...], Any, str] | tuple[tuple[type, ...], Any, str, Any]
_NUMBER = (int, float)
_FIELDS: dict[str, Field] = {
    "temperature": (_NUMBER, lambda v: 0 <= v <= 100, "a number >= 0"),
    "top_p": (_NUMBER, lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "top_k": ((int,), lambda v: v == -1 or v >= 0, "an integer >= 0, or -1 for all"),
    "min_p": (_NUMBER, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "max_tokens": ((int,), lambda v: v > 0, "an integer > 0"),
    "min_tokens": ((int,), lambda v: v >= 0, "an integer >= 0"),
    "seed": ((int,), lambda v: 0 <= v < 2**63, "an integer >= 0"),
    "presence_penalty": (_NUMBER, lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
    "frequency_penalty": (_NUMBER, lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
    "repetition_penalty": (_NUMBER, lambda v: 0 < v <= 10, "a number in (0, 10]"),
    "logprobs": ((int,), lambda v: 0 <= v <= 20, "an integer in [0, 20]"),
    "stop": (
        (str, list),
        lambda v: isinstance(v, str) or all(isinstance(s, str) for s in v),
        "a string or a list of strings",
    ),
    "ignore_eos": ((bool,), lambda v: True, "true or false"),
    "skip_special_tokens": ((bool,), lambda v: True, "true or false"),
}
# vllm_backend clients put these in the same JSON; they are not sampling settings.
_PASS_THROUGH_KEYS = {"lora_name"}

STRUCTURED_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
# StructuredOutputsParams also has disable_any_whitespace, disable_additional_properties and
# whitespace_pattern, but vLLM 0.32's backends (xgrammar, guidance) read the first two from the
# engine's structured_outputs_config and never the third: per request they would be ignored.


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(i) and i >= 0 for i in value)


def _logit_bias(value: dict) -> bool:
    return all(
        str(key).strip().isdigit()
        and isinstance(bias, (int, float))
        and not isinstance(bias, bool)
        and -100 <= bias <= 100
        for key, bias in value.items()
    )


def _structured(value: dict) -> bool:
    constraints = [key for key in STRUCTURED_CONSTRAINTS if value.get(key) is not None]
    if len(constraints) != 1 or set(value) - set(STRUCTURED_CONSTRAINTS):
        return False
    kind = value[constraints[0]]
    valid = {
        "json": isinstance(kind, (dict, str)),
        "regex": isinstance(kind, str),
        "choice": isinstance(kind, list) and bool(kind) and all(isinstance(c, str) for c in kind),
        "grammar": isinstance(kind, str),
        "json_object": kind is True,
        "structural_tag": isinstance(kind, str),
    }[constraints[0]]
    return valid


# Free text generation (qwen_vl_lora) adds these to _FIELDS; a task passes them as task_fields.
GENERATION_FIELDS: dict[str, Field] = {
    "n": (
        (int,),
        lambda v: v == 1,
        "1: each request returns one sequence (send n requests, with different seeds, for n "
        "samples)",
    ),
    "stop_token_ids": ((list,), _token_ids, "a list of token ids >= 0"),
    "include_stop_str_in_output": ((bool,), lambda v: True, "true or false"),
    "spaces_between_special_tokens": ((bool,), lambda v: True, "true or false"),
    "bad_words": (
        (list,),
        lambda v: all(isinstance(w, str) and w.strip() for w in v),
        "a list of non-empty strings",
    ),
    "allowed_token_ids": (
        (list,),
        lambda v: bool(v) and _token_ids(v),
        "a non-empty list of token ids >= 0",
    ),
    "logit_bias": (
        (dict,),
        _logit_bias,
        'an object of token id -> bias in [-100, 100], e.g. {"1234": -100}',
        lambda v: {int(key): float(bias) for key, bias in v.items()},
    ),
    "structured_outputs": (
        (dict,),
        _structured,
        "an object (or its JSON text) with exactly one of "
        + ", ".join(STRUCTURED_CONSTRAINTS)
        + ' and nothing else, e.g. {"json": {...schema...}} or {"choice": ["yes", "no"]} (vLLM '
        "0.32 would ignore disable_any_whitespace, disable_additional_properties and "
        "whitespace_pattern per request)",
    ),
}

# The other SamplingParams fields of vLLM 0.32 (and vllm_backend-era names), each with the reason
# it is refused; tests/unit/test_sampling.py checks that the two tables cover every field.
_SERVER_SET = "set by the server (from the stream input)"
NOT_OFFERED: dict[str, str] = {
    "best_of": "vLLM 0.32 has no best_of (send several requests)",
    "use_beam_search": "beam search is not offered by this model",
    "length_penalty": "it applies to beam search, which is not offered by this model",
    "early_stopping": "it applies to beam search, which is not offered by this model",
    "prompt_logprobs": "no output carries prompt logprobs",
    "prompt_logprob_token_ids": "no output carries prompt logprobs",
    "prompt_logprob_start": "no output carries prompt logprobs",
    "logprob_token_ids": "the logprobs output reports the top tokens only",
    "flat_logprobs": "the logprobs output has its own format",
    "detokenize": "text_output needs detokenized text",
    "output_kind": _SERVER_SET,
    "stream_interval": _SERVER_SET,
    "skip_clone": "an engine-internal setting",
    "output_text_buffer_length": "an engine-internal setting",
    "skip_reading_prefix_cache": "an engine-internal setting",
    "routed_experts_prompt_start": "an engine-internal setting",
    "trace_decode_token_ids": "a debugging setting of the engine",
    "extra_args": "no custom logits processors are installed",
    "logits_processors": "no custom logits processors are installed",
    "watermarking": "no watermarking is configured",
    "thinking_token_budget": "this model has no reasoning mode",
    "repetition_detection": "not offered by this server",
    "truncate_prompt_tokens": "prompts are never truncated; shorten the input",
    "guided_decoding": "renamed structured_outputs in vLLM 0.32",
}


def parse_sampling_parameters(
    raw: str | None,
    *,
    defaults: dict[str, Any],
    max_tokens_limit: int,
    task_fields: dict[str, Field] | None = None,
) -> tuple[dict[str, Any], str | None]:
    """Return (SamplingParams kwargs + task keys, lora_name found in the JSON or None)."""
    fields = {**_FIELDS, **(task_fields or {})}
    params = dict(defaults)
    if raw is None or raw.strip() == "":
        return params, None
    try:
        given = json.loads(raw)
    except json.JSONDecodeError as err:
        raise InvalidRequest(
            f"sampling_parameters is not valid JSON: {err.msg} at {err.pos}"
        ) from None
    if not isinstance(given, dict):
        raise InvalidRequest('sampling_parameters must be a JSON object, e.g. {"max_tokens": 64}')
    problems = []
    for key, value in given.items():
        if key in _PASS_THROUGH_KEYS:
            continue
        if key not in fields:
            problems.append(_not_accepted(key, fields))
            continue
        value, allowed = check_field(fields[key], value)
        if allowed is not None:
            problems.append(f"'{key}' must be {allowed}, got {json.dumps(given[key])}")
            continue
        params[key] = value
    if "max_tokens" in params and params["max_tokens"] > max_tokens_limit:
        problems.append(
            f"'max_tokens' must be at most {max_tokens_limit} for this model, "
            f"got {params['max_tokens']}"
        )
    if problems:
        raise InvalidRequest("sampling_parameters: " + "; ".join(problems))
    lora_name = given.get("lora_name")
    if lora_name is not None and not isinstance(lora_name, str):
        raise InvalidRequest("sampling_parameters: 'lora_name' must be a string")
    return params, lora_name


def check_field(field: Field, value: Any) -> tuple[Any, str | None]:
    """(the value as the engine takes it, None) or (value, what the key allows) when it is not.
    Used for request JSON and for model.json defaults alike."""
    types, check, allowed, *convert = field
    value = _from_string(value, types)
    # bool is an int in Python; a JSON true is never a valid number here.
    wrong_type = not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
    if wrong_type or (isinstance(value, float) and not math.isfinite(value)) or not check(value):
        return value, allowed
    return (convert[0](value) if convert else value), None


def _not_accepted(key: str, fields: dict[str, Field]) -> str:
    if key in NOT_OFFERED:
        return f"'{key}' is not supported: {NOT_OFFERED[key]}"
    if key in GENERATION_FIELDS or key in _FIELDS:  # a generation field this task does not take
        return f"'{key}' is not supported by this model"
    return f"unknown key '{key}' (allowed: {', '.join(sorted(fields))})"


def _from_string(value: Any, types: tuple[type, ...]) -> Any:
    """A string where the key takes a number or a boolean -> that value, as Triton's vllm_backend
    reads them (its CI and genai-perf send {"max_tokens": "16", "temperature": "0"}); unlike
    vllm_backend, "false" is False. A list or object key takes its JSON text. A string that does
    not parse is returned as it is (and refused with the key's rule)."""
    if not isinstance(value, str) or str in types:
        return value
    text = value.strip()
    if list in types or dict in types:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return value
    if types == (bool,):
        return {"true": True, "1": True, "false": False, "0": False}.get(text.lower(), value)
    try:
        if int in types and text.lstrip("+-").isdigit():
            return int(text)
        if float in types:
            return float(text)
    except ValueError:
        pass
    return value
