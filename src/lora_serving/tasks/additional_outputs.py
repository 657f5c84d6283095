"""Triton vllm_backend's additional outputs (its docs/additional_outputs.md), opt-in per request.

A request sets the BOOL input `return_<name>` to get output `<name>` on every response:

- finish_reason       TYPE_STRING  "length" | "stop" | "abort" on the last response, "None" on
                                   the streamed ones before it (vllm_backend's str(None))
- cumulative_logprob  TYPE_FP32    sum of the generated tokens' logprobs so far
- logprobs            TYPE_STRING  JSON: per token generated since the previous response,
                                   {"<token id>": {"logprob", "rank", "decoded_token"}} of the
                                   top `sampling_parameters.logprobs` tokens plus the chosen one;
                                   "null" when the request did not set `logprobs`
- num_input_tokens    TYPE_UINT32  prompt tokens (image and video tokens included)
- num_output_tokens   TYPE_UINT32  tokens generated since the previous response (all of them
                                   when not streaming)

One difference: vllm_backend sends NaN as cumulative_logprob when `logprobs` is unset (vLLM
computes none); here the request then asks vLLM for logprobs=0, so the value is real.
"""

import json
import math
from typing import Any

from lora_serving.jobs import GenerationChunk, SentTokens
from lora_serving.request_inputs import RawRequest

NAMES = ("finish_reason", "cumulative_logprob", "logprobs", "num_input_tokens", "num_output_tokens")
INPUTS = tuple(f"return_{name}" for name in NAMES)


def requested(raw: RawRequest, rows: range) -> frozenset[str]:
    """The outputs any row of the request asked for (one tensor carries every row)."""
    return frozenset(
        name
        for name in NAMES
        if any(raw.boolean(f"return_{name}", row, default=False) for row in rows)
    )


def with_logprobs_for(wanted: frozenset[str], sampling: dict[str, Any]) -> dict[str, Any]:
    """The sampling kwargs vLLM needs for `wanted`: a cumulative logprob needs logprobs on."""
    if "cumulative_logprob" in wanted and sampling.get("logprobs") is None:
        return {**sampling, "logprobs": 0}
    return sampling


def render(
    wanted: frozenset[str],
    chunk: GenerationChunk,
    *,
    stream: bool,
    sent: SentTokens,
    logprobs_asked: bool,
) -> dict[str, Any]:
    """Output name -> value for one response. `sent` (the job's) remembers how many tokens
    earlier responses carried, so streamed counts and logprobs are per response."""
    if not wanted:
        return {}
    already = sent.count if stream else 0
    total = chunk.num_output_tokens
    if stream:
        sent.count = total
    values: dict[str, Any] = {}
    if "finish_reason" in wanted:
        values["finish_reason"] = str(chunk.finish_reason)
    if "cumulative_logprob" in wanted:
        cumulative = chunk.cumulative_logprob
        values["cumulative_logprob"] = math.nan if cumulative is None else cumulative
    if "logprobs" in wanted:
        values["logprobs"] = logprobs_json(
            chunk.top_logprobs[already:total] if logprobs_asked and chunk.top_logprobs else None
        )
    if "num_input_tokens" in wanted:
        values["num_input_tokens"] = chunk.num_prompt_tokens
    if "num_output_tokens" in wanted:
        values["num_output_tokens"] = total - already
    return values


def logprobs_json(steps) -> str:
    """vLLM's per-token {token id: Logprob} dicts -> vllm_backend's JSON text."""
    if steps is None:
        return "null"
    return json.dumps(
        [
            {
                str(token_id): {
                    "logprob": float(entry.logprob),
                    "rank": entry.rank,
                    "decoded_token": entry.decoded_token,
                }
                for token_id, entry in step.items()
            }
            for step in steps
        ]
    )
