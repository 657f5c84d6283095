import json

import pytest

from lora_serving.errors import InvalidRequest
from lora_serving.sampling import GENERATION_FIELDS, NOT_OFFERED, parse_sampling_parameters

DEFAULTS = {"temperature": 0.0, "max_tokens": 32}


def parse(raw):
    return parse_sampling_parameters(raw, defaults=DEFAULTS, max_tokens_limit=400)


def test_empty_means_defaults():
    assert parse(None) == (DEFAULTS, None)
    assert parse("  ") == (DEFAULTS, None)


def test_values_override_defaults_and_lora_name_is_passed_through():
    params, lora = parse('{"temperature": 0.7, "max_tokens": 10, "seed": 3, "lora_name": "a"}')
    assert params == {"temperature": 0.7, "max_tokens": 10, "seed": 3}
    assert lora == "a"


@pytest.mark.parametrize(
    "raw, message",
    [
        ("{", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"max_tokens": 0}', "'max_tokens' must be an integer > 0, got 0"),
        ('{"max_tokens": -5}', "'max_tokens' must be an integer > 0"),
        ('{"max_tokens": "twelve"}', "'max_tokens' must be an integer > 0, got \"twelve\""),
        ('{"max_tokens": 100000}', "'max_tokens' must be at most 400"),
        ('{"max_tokens": true}', "'max_tokens' must be an integer"),
        ('{"temperature": -1}', "'temperature' must be a number >= 0"),
        ('{"top_p": 0}', "'top_p' must be a number in (0, 1]"),
        ('{"stop": [1]}', "'stop' must be a string or a list of strings"),
        ('{"best_of": 2}', "'best_of' is not supported: vLLM 0.32 has no best_of"),
        ('{"n": 2}', "'n' is not supported by this model"),
        ('{"bogus": 2}', "unknown key 'bogus'"),
        ('{"lora_name": 3}', "'lora_name' must be a string"),
    ],
)
def test_bad_values_are_named(raw, message):
    with pytest.raises(InvalidRequest, match="sampling_parameters") as err:
        parse(raw)
    assert message in str(err.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(InvalidRequest) as err:
        parse('{"max_tokens": 0, "top_k": -7, "nope": 1}')
    text = str(err.value)
    assert "max_tokens" in text and "top_k" in text and "'nope'" in text


def test_string_values_are_read_as_vllm_backend_clients_send_them():
    """genai-perf and vllm_backend's CI send every value as a string."""
    params, lora = parse(
        '{"max_tokens": "16", "temperature": "0", "top_p": "1", "ignore_eos": "false", '
        '"seed": " 7 ", "lora_name": "alpha"}'
    )
    assert params == {
        "temperature": 0.0,
        "max_tokens": 16,
        "top_p": 1.0,
        "ignore_eos": False,
        "seed": 7,
    }
    assert lora == "alpha"
    assert parse('{"ignore_eos": "TRUE", "stop": "0"}')[0]["ignore_eos"] is True
    assert parse('{"stop": "0"}')[0]["stop"] == "0"  # a string key keeps its string


def test_strings_that_do_not_parse_are_refused_with_the_value_sent():
    with pytest.raises(InvalidRequest) as err:
        parse('{"max_tokens": "16.5", "ignore_eos": "yes", "top_p": "nan", "seed": "x"}')
    message = str(err.value)
    assert "'max_tokens' must be an integer > 0, got \"16.5\"" in message
    assert "'ignore_eos' must be true or false, got \"yes\"" in message
    assert "'top_p' must be a number in (0, 1], got \"nan\"" in message
    assert "'seed' must be an integer >= 0, got \"x\"" in message


# ---- free text generation (qwen_vl_lora): GENERATION_FIELDS -----------------------------------
def parse_generation(given: dict):
    return parse_sampling_parameters(
        json.dumps(given), defaults=DEFAULTS, max_tokens_limit=400, task_fields=GENERATION_FIELDS
    )[0]


def test_generation_fields_are_converted_to_what_sampling_params_takes():
    params = parse_generation(
        {
            "n": "1",
            "stop_token_ids": "[151645, 2]",
            "include_stop_str_in_output": "true",
            "spaces_between_special_tokens": False,
            "bad_words": ["foo bar"],
            "allowed_token_ids": [1, 2, 3],
            "logit_bias": {"1234": -100, " 7 ": 2.5},
            "min_tokens": "2",
            "logprobs": "2",
        }
    )
    assert params == {
        **DEFAULTS,
        "n": 1,
        "stop_token_ids": [151645, 2],
        "include_stop_str_in_output": True,
        "spaces_between_special_tokens": False,
        "bad_words": ["foo bar"],
        "allowed_token_ids": [1, 2, 3],
        "logit_bias": {1234: -100.0, 7: 2.5},
        "min_tokens": 2,
        "logprobs": 2,
    }


@pytest.mark.parametrize(
    "value",
    [
        {"json": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        {"json": '{"type": "object"}'},
        {"regex": "[a-z]+"},
        {"choice": ["yes", "no"]},
        {"grammar": 'root ::= "a" | "b"'},
        {"json_object": True},
    ],
)
def test_structured_outputs_as_object_or_as_vllm_backends_json_text(value):
    assert parse_generation({"structured_outputs": value})["structured_outputs"] == value
    text = json.dumps(value)  # vllm_backend: StructuredOutputsParams(**json.loads(value))
    assert parse_generation({"structured_outputs": text})["structured_outputs"] == value


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"json": {}, "regex": "a"},
        {"choice": []},
        {"choice": [1, 2]},
        {"json_object": False},
        {"regex": "a", "backend": "xgrammar"},
        {"regex": "a", "disable_any_whitespace": True},  # ignored per request by vLLM 0.32
        {"json": {}, "whitespace_pattern": " "},
        "not json",
        ["regex", "a"],
    ],
)
def test_bad_structured_outputs_are_refused(value):
    with pytest.raises(InvalidRequest, match="'structured_outputs' must be an object"):
        parse_generation({"structured_outputs": value})


def test_generation_field_problems_come_in_one_error():
    with pytest.raises(InvalidRequest) as err:
        parse_generation(
            {
                "n": 3,
                "best_of": 2,
                "use_beam_search": True,
                "logit_bias": {"x": 1},
                "stop_token_ids": [-1],
                "allowed_token_ids": [],
                "bad_words": [""],
                "prompt_logprobs": 1,
                "temperature": "hot",
            }
        )
    message = str(err.value)
    assert message.count(";") == 8, message
    assert "'n' must be 1: each request returns one sequence" in message
    assert "'best_of' is not supported" in message
    assert "'use_beam_search' is not supported: beam search is not offered" in message
    assert "'prompt_logprobs' is not supported: no output carries prompt logprobs" in message
    for key in ("logit_bias", "stop_token_ids", "allowed_token_ids", "bad_words", "temperature"):
        assert f"'{key}' must be" in message


def test_every_sampling_params_field_is_accepted_or_refused_with_a_reason():
    """vLLM's SamplingParams fields: none may fall through as an 'unknown key'."""
    from vllm.sampling_params import SamplingParams

    from lora_serving.sampling import _FIELDS

    public = {name for name in SamplingParams.__struct_fields__ if not name.startswith("_")}
    assert {"n", "logit_bias", "structured_outputs"} <= public
    covered = set(_FIELDS) | set(GENERATION_FIELDS) | set(NOT_OFFERED)
    assert public - covered == set()
