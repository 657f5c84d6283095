import pytest

from lora_serving.errors import InvalidRequest
from lora_serving.sampling import parse_sampling_parameters

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
        ('{"best_of": 2}', "unknown key 'best_of'"),
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
