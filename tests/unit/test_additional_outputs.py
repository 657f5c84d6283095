"""vllm_backend's additional outputs: which a request asked for, and their per-response values."""

import json
import math
from dataclasses import dataclass

import numpy as np

from lora_serving.jobs import GenerationChunk, SentTokens
from lora_serving.request_inputs import RawRequest
from lora_serving.tasks import additional_outputs

ALL = frozenset(additional_outputs.NAMES)


@dataclass
class Logprob:  # vLLM's Logprob
    logprob: float
    rank: int
    decoded_token: str


def step(chosen: int, text: str, logprob: float) -> dict:
    return {chosen: Logprob(logprob, 1, text), 99: Logprob(-9.5, 2, "x")}


STEPS = [step(5, "a", -0.5), step(6, " b", -1.0), step(7, "c", -0.25)]


def chunk(tokens: int, finish_reason=None) -> GenerationChunk:
    return GenerationChunk(
        text="",
        delta="",
        token_ids=list(range(tokens)),
        logprobs=[],
        num_prompt_tokens=11,
        finish_reason=finish_reason,
        cumulative_logprob=sum(next(iter(s.values())).logprob for s in STEPS[:tokens]),
        top_logprobs=STEPS[:tokens],
    )


def test_requested_reads_the_return_inputs_of_every_row():
    tensors = {
        "return_finish_reason": np.array([[False], [True]]),
        "return_logprobs": np.array([[False], [False]]),
    }
    assert additional_outputs.requested(RawRequest(tensors), range(2)) == {"finish_reason"}
    assert additional_outputs.requested(RawRequest({"x": np.zeros((1, 1))}), range(1)) == set()


def test_nothing_asked_nothing_sent():
    assert (
        additional_outputs.render(
            frozenset(), chunk(2), stream=True, sent=SentTokens(), logprobs_asked=True
        )
        == {}
    )


def test_streamed_responses_carry_what_is_new_since_the_previous_one():
    sent = SentTokens()
    first = additional_outputs.render(ALL, chunk(1), stream=True, sent=sent, logprobs_asked=True)
    last = additional_outputs.render(
        ALL, chunk(3, "length"), stream=True, sent=sent, logprobs_asked=True
    )
    assert first["finish_reason"] == "None" and last["finish_reason"] == "length"
    assert (first["num_output_tokens"], last["num_output_tokens"]) == (1, 2)
    assert first["num_input_tokens"] == last["num_input_tokens"] == 11
    assert first["cumulative_logprob"] == -0.5 and last["cumulative_logprob"] == -1.75
    assert json.loads(first["logprobs"]) == [
        {
            "5": {"logprob": -0.5, "rank": 1, "decoded_token": "a"},
            "99": {"logprob": -9.5, "rank": 2, "decoded_token": "x"},
        }
    ]
    assert [list(s) for s in json.loads(last["logprobs"])] == [["6", "99"], ["7", "99"]]


def test_a_final_only_response_carries_everything():
    values = additional_outputs.render(
        ALL, chunk(3, "stop"), stream=False, sent=SentTokens(), logprobs_asked=True
    )
    assert values["num_output_tokens"] == 3 and len(json.loads(values["logprobs"])) == 3


def test_logprobs_null_when_the_request_did_not_set_them():
    values = additional_outputs.render(
        ALL, chunk(2, "stop"), stream=False, sent=SentTokens(), logprobs_asked=False
    )
    assert values["logprobs"] == "null"
    unknown = GenerationChunk("", "", [1], [], 3, "stop")
    values = additional_outputs.render(
        ALL, unknown, stream=False, sent=SentTokens(), logprobs_asked=False
    )
    assert math.isnan(values["cumulative_logprob"])


def test_cumulative_logprob_asks_vllm_for_logprobs_only_when_needed():
    wanted = frozenset({"cumulative_logprob"})
    assert additional_outputs.with_logprobs_for(wanted, {"max_tokens": 3})["logprobs"] == 0
    assert additional_outputs.with_logprobs_for(wanted, {"logprobs": 4})["logprobs"] == 4
    assert "logprobs" not in additional_outputs.with_logprobs_for(frozenset(), {})
