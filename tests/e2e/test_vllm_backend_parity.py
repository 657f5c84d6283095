"""qwen_vl_lora answers the requests Triton's vllm_backend CI sends (ci/L0_additional_outputs_vllm,
ci/L0_multi_gpu_vllm/multi_lora): string-valued sampling parameters, the same settings as request
parameters, lora_name inside sampling_parameters, exclude_input_in_output, the return_* additional
outputs streamed and not, plus structured outputs and per-request refusals of bad fields.

One difference from vllm_backend's CI: our model batches (max_batch_size > 0), so every input
carries the batch dimension ([1, 1] instead of [1]).
"""

import json
import re

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from lora_client.requests import infer_inputs

from tests.conftest import only_with_model
from tests.e2e.test_serving_stack import png
from tests.e2e.triton_calls import grpc_many, grpc_one

MODEL = "qwen_vl_lora"
PROMPT = "In this example,"
CI_SAMPLING = {"temperature": "0", "top_p": "1"}  # vllm_backend's CI sends strings
RETURNS = (
    "finish_reason",
    "cumulative_logprob",
    "logprobs",
    "num_input_tokens",
    "num_output_tokens",
)

pytestmark = only_with_model(MODEL)


def stream_all(url: str, fields: dict, parameters: dict | None = None) -> list:
    """Every response of one request (the CI's _llm_infer): [(result, error), ...]."""
    responses = []
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(lambda result, error: responses.append((result, error)))
        client.async_stream_infer(MODEL, infer_inputs(grpcclient, fields), parameters=parameters)
        client.stop_stream()
    assert responses
    return responses


def ci_fields(stream: bool, logprobs=None, returns=(), **extra) -> dict:
    sampling = {**CI_SAMPLING, "max_tokens": "12", "min_tokens": "12"}
    if logprobs is not None:
        sampling["logprobs"] = logprobs
    fields = {"text_input": PROMPT, "stream": stream, "sampling_parameters": json.dumps(sampling)}
    fields.update({f"return_{name}": True for name in returns})
    return {**fields, **extra}


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize(
    "logprobs, returns",
    [(2, RETURNS), (None, RETURNS), (0, ("logprobs", "num_output_tokens")), (None, ())],
)
def test_additional_outputs_as_vllm_backend_ci_checks_them(grpc_url, stream, logprobs, returns):
    responses = stream_all(grpc_url, ci_fields(stream, logprobs, returns), CI_SAMPLING)
    assert all(error is None for _, error in responses), responses
    results = [result for result, _ in responses]
    assert len(results) > 1 if stream else len(results) == 1
    for name in set(RETURNS) - set(returns):  # not asked: not sent
        assert all(result.as_numpy(name) is None for result in results), name
    text = "".join(r.as_numpy("text_output")[0, 0].decode() for r in results)
    assert text
    tokens = 0
    previous_cumulative = 0.0
    for index, result in enumerate(results):
        last = index == len(results) - 1
        if "finish_reason" in returns:
            reason = result.as_numpy("finish_reason")[0, 0].decode()
            assert reason == ("length" if last else "None")
        if "num_input_tokens" in returns:
            assert result.as_numpy("num_input_tokens").dtype == np.uint32
            assert 0 < result.as_numpy("num_input_tokens")[0, 0] < 64
        count = None
        if "num_output_tokens" in returns:
            count = int(result.as_numpy("num_output_tokens")[0, 0])
            assert count > 0
            tokens += count
        if "cumulative_logprob" in returns:
            value = result.as_numpy("cumulative_logprob")
            assert value.dtype == np.float32
            assert value[0, 0] < previous_cumulative  # every response adds tokens
            previous_cumulative = value[0, 0]
        if "logprobs" in returns:
            steps = json.loads(result.as_numpy("logprobs")[0, 0])
            if logprobs is None:
                assert steps is None
                continue
            assert count is None or len(steps) == count
            for step in steps:
                # vLLM's top `logprobs`, plus the sampled token when it is not among them
                # (logprobs 0: the sampled token alone).
                assert max(1, logprobs) <= len(step) <= logprobs + 1
                assert sorted(e["rank"] for e in step.values())[0] == 1
                assert all(
                    isinstance(token_id, str) and set(entry) == {"logprob", "rank", "decoded_token"}
                    for token_id, entry in step.items()
                )
    if "num_output_tokens" in returns:
        assert tokens == 12


def test_settings_as_request_parameters_when_the_input_is_absent(grpc_url):
    """vllm_backend's other path (BLS callers): sampling settings in the request parameters."""
    fields = {"text_input": PROMPT, "return_num_output_tokens": True}
    outcome = grpc_one(grpc_url, MODEL, fields, {**CI_SAMPLING, "max_tokens": "3"})
    assert outcome.outputs["num_output_tokens"] == [3]
    outcome = grpc_one(grpc_url, MODEL, fields, {"max_tokens": 3, "best_of": 2})
    assert "'best_of' is not supported" in outcome.error


def test_lora_name_in_sampling_parameters_and_string_values(grpc_url):
    """ci/L0_multi_gpu_vllm/multi_lora: {"lora_name": ..., "temperature": "0", ...} in the input
    gives what typed values with the adapter as a request parameter give."""
    image = {"image": [png()], "exclude_input_in_output": True}
    strings = {**CI_SAMPLING, "max_tokens": "10", "lora_name": "alpha"}
    typed = {"temperature": 0, "top_p": 1.0, "max_tokens": 10}
    as_strings = grpc_one(
        grpc_url, MODEL, {"text_input": PROMPT, **image, "sampling_parameters": json.dumps(strings)}
    )
    as_typed = grpc_one(
        grpc_url,
        MODEL,
        {"text_input": PROMPT, **image, "sampling_parameters": json.dumps(typed)},
        {"lora_name": "alpha"},
    )
    base = grpc_one(
        grpc_url, MODEL, {"text_input": PROMPT, **image, "sampling_parameters": json.dumps(typed)}
    )
    assert as_strings.text == as_typed.text != base.text


def test_exclude_input_in_output(grpc_url):
    sampling = json.dumps({**CI_SAMPLING, "max_tokens": "6"})
    fields = {"text_input": PROMPT, "sampling_parameters": sampling}
    with_prompt = grpc_one(grpc_url, MODEL, fields).text
    without = grpc_one(grpc_url, MODEL, {**fields, "exclude_input_in_output": True}).text
    assert with_prompt.endswith(without) and PROMPT in with_prompt[: -len(without)]
    refused = grpc_one(
        grpc_url, MODEL, {**fields, "stream": True, "exclude_input_in_output": False}
    )
    assert "exclude_input_in_output=false cannot be streamed" in refused.error


def test_structured_outputs_json_schema_choice_regex(grpc_url):
    """The random-weight demo model would fill a JSON object with whitespace up to max_tokens
    (vLLM 0.32 allows any whitespace between JSON tokens unless the engine disables it), so the
    schema is one whose JSON has no room for whitespace."""

    def ask(structured, **extra) -> str:
        sampling = {**CI_SAMPLING, "max_tokens": "40", "structured_outputs": structured}
        fields = {"text_input": "Describe the image.", "image": [png()], **extra}
        fields.update(exclude_input_in_output=True, sampling_parameters=json.dumps(sampling))
        outcome = grpc_one(grpc_url, MODEL, fields)
        return "".join(outcome.partials) + outcome.text  # streamed: the deltas, then the last

    schema = {"enum": ["small", "large", 7]}
    assert json.loads(ask(json.dumps({"json": schema}))) in schema["enum"]  # vllm_backend's form
    assert ask({"choice": ["yes", "no"]}) in ("yes", "no")
    assert re.fullmatch("[0-9]{3}-[a-c]{2}", ask({"regex": "[0-9]{3}-[a-c]{2}"}, stream=True))


def test_bad_fields_fail_only_their_own_request(grpc_url):
    good = {"text_input": PROMPT, "sampling_parameters": json.dumps({"max_tokens": "4"})}
    bad_fields = {
        "n": "2",
        "use_beam_search": "true",
        "logit_bias": {"x": 1},
        "structured_outputs": {"json": {}, "regex": "a"},
        "max_tokens": "many",
    }
    bad = {"text_input": PROMPT, "sampling_parameters": json.dumps(bad_fields)}
    unsupported_regex = {
        "text_input": PROMPT,
        "sampling_parameters": json.dumps({"structured_outputs": {"regex": "(unclosed"}}),
    }
    outcomes = grpc_many(
        grpc_url, MODEL, [(good, None), (bad, None), (good, None), (unsupported_regex, None)]
    )
    assert outcomes[0].error is None and outcomes[2].error is None
    assert outcomes[0].text == outcomes[2].text
    message = outcomes[1].error
    for key in bad_fields:
        assert f"'{key}'" in message, (key, message)
    assert message.count(";") == len(bad_fields) - 1, message
    assert outcomes[3].error, outcomes[3]  # vLLM's own check of the regex, for this one only
