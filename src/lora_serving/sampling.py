"""`sampling_parameters` JSON (Triton vllm_backend's keys) -> keyword arguments of SamplingParams.

Every problem is reported in one InvalidRequest naming the key and what is allowed, so a client
fixes its request once instead of once per key. A task may accept keys of its own
(`task_fields`, e.g. Whisper's suppress_tokens); they come back in the same dict and the task
takes them out before the rest becomes SamplingParams.
"""

import json
import math
from typing import Any

from lora_serving.errors import InvalidRequest

# key -> (accepted python types, check on the value, human description of the valid range)
Field = tuple[tuple[type, ...], Any, str]
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
            problems.append(f"unknown key '{key}' (allowed: {', '.join(sorted(fields))})")
            continue
        types, check, allowed = fields[key]
        value = _from_string(value, types)
        # bool is an int in Python; a JSON true is never a valid number here.
        wrong_type = not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
        if (
            wrong_type
            or (isinstance(value, float) and not math.isfinite(value))
            or not check(value)
        ):
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


def _from_string(value: Any, types: tuple[type, ...]) -> Any:
    """A string where the key takes a number or a boolean -> that value, as Triton's vllm_backend
    reads them (its CI and genai-perf send {"max_tokens": "16", "temperature": "0"}); unlike
    vllm_backend, "false" is False. A string that does not parse is returned as it is (and
    refused with the key's rule)."""
    if not isinstance(value, str) or str in types:
        return value
    text = value.strip()
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
