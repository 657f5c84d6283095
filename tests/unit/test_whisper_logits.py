"""Whisper's decoding rules on one request's logits row (suppression, then timestamps), the
vLLM processor that carries them, and the options that choose them."""

import math

import pytest
import torch

from lora_serving.errors import ConfigError, InvalidRequest
from lora_serving.sampling import parse_sampling_parameters
from lora_serving.tasks import whisper_options
from lora_serving.tasks.whisper_logits import EXTRA_ARG, DecodingRules, WhisperLogitsRules
from lora_serving.tasks.whisper_timestamps import TimestampRules

EOT, TS = 50257, 50364
VOCAB = TS + 1501
BLANK, PAREN, TEXT = 220, 7, 440
LISTS = whisper_options.SuppressionLists(non_speech=(PAREN, 8, 9), at_begin=(BLANK, EOT))


def flat() -> torch.Tensor:
    return torch.zeros(VOCAB)


def test_begin_suppression_only_at_the_first_sampled_position():
    rules = DecodingRules(suppress_at_begin=(BLANK, EOT))
    first = rules([], flat())
    assert first[BLANK] == -math.inf and first[EOT] == -math.inf and first[TEXT] == 0
    later = rules([TEXT], flat())
    assert later[BLANK] == 0 and later[EOT] == 0


def test_suppressed_tokens_never_win_greedy():
    logits = flat()
    logits[PAREN] = 50.0  # "(" would be the argmax, as for an adapter that says "(indistinct)"
    logits[TEXT] = 1.0
    out = DecodingRules(suppress=(PAREN,))([TEXT], logits)
    assert int(out.argmax()) == TEXT


def test_timestamp_rules_see_the_suppressed_logits():
    """The 'timestamps likelier than text' test runs after suppression, as in openai-whisper and
    transformers: a suppressed text token cannot keep timestamps out."""
    logits = flat()
    logits[PAREN] = 30.0  # would beat every timestamp, were it not suppressed
    logits[TS + 10] = 5.0
    rules = DecodingRules(suppress=(PAREN,), timestamps=TimestampRules(TS, EOT))
    out = rules([TS, TEXT], logits)
    assert int(out.argmax()) == TS + 10
    assert torch.isinf(out[:TS]).all()


def test_extra_arg_round_trip_and_bad_keys():
    rules = DecodingRules((1, 2), (BLANK,), TimestampRules(TS, EOT))
    assert DecodingRules.from_extra_arg(rules.as_extra_arg()) == rules
    assert DecodingRules().empty and not rules.empty
    with pytest.raises(ValueError, match="unknown whisper_rules keys"):
        DecodingRules.from_extra_arg({"suppres": [1]})


def test_the_vllm_processor_applies_only_to_requests_that_carry_rules():
    from vllm import SamplingParams

    processor = WhisperLogitsRules(None, torch.device("cpu"), False)
    assert processor.new_req_logits_processor(SamplingParams()) is None
    rules = DecodingRules(suppress=(PAREN,))
    asked = SamplingParams(extra_args={EXTRA_ARG: rules.as_extra_arg()})
    assert processor.new_req_logits_processor(asked) == rules
    assert not processor.is_argmax_invariant()
    with pytest.raises(TypeError):
        bad = {"suppress": [], "timestamps": {"x": 1}}
        WhisperLogitsRules.validate_params(SamplingParams(extra_args={EXTRA_ARG: bad}))


@pytest.mark.parametrize(
    "options, everywhere, at_begin",
    [
        (whisper_options.DEFAULTS, (PAREN, 8, 9), (BLANK, EOT)),
        ({"suppress_tokens": [], "suppress_blank": True}, (), (BLANK, EOT)),
        ({"suppress_tokens": "", "suppress_blank": False}, (), ()),
        ({"suppress_tokens": [1234], "suppress_blank": True}, (PAREN, 8, 9, 1234), (BLANK, EOT)),
        ({"suppress_tokens": "-1,1234", "suppress_blank": True}, (PAREN, 8, 9, 1234), (BLANK, EOT)),
    ],
)
def test_options_resolve_like_openai_whisper(options, everywhere, at_begin):
    assert LISTS.resolve(options) == (tuple(sorted(everywhere)), at_begin)


def parse(raw: str):
    defaults = {"max_tokens": 8, **whisper_options.DEFAULTS}
    fields = whisper_options.task_fields(VOCAB)
    return parse_sampling_parameters(
        raw, defaults=defaults, max_tokens_limit=400, task_fields=fields
    )[0]


def test_sampling_parameters_take_the_whisper_keys():
    assert parse('{"suppress_tokens": [], "suppress_blank": false}')["suppress_tokens"] == []
    assert parse("{}")["suppress_tokens"] == [-1]
    with pytest.raises(InvalidRequest) as err:
        parse('{"suppress_tokens": [99999999, "a"], "suppress_blank": 1}')
    message = str(err.value)
    assert "'suppress_tokens' must be a list of token ids in [0, 51865)" in message
    assert "'suppress_blank' must be true or false, got 1" in message


def test_model_json_defaults_are_checked(tmp_path):
    given = {"decoding": {"suppress_blank": False}}
    assert whisper_options.decoding_defaults(given, VOCAB, "m")["suppress_blank"] is False
    with pytest.raises(ConfigError) as err:
        bad = {"decoding": {"suppress_tokens": "x", "beam": 5}}
        whisper_options.decoding_defaults(bad, VOCAB, "model.json")
    assert "unknown key serving.task.decoding.beam" in str(err.value)
    assert "serving.task.decoding.suppress_tokens must be" in str(err.value)


def test_the_demo_model_lists_come_from_its_generation_config(tmp_path):
    (tmp_path / "generation_config.json").write_text(
        '{"suppress_tokens": [1, 2], "begin_suppress_tokens": [220, 50257]}'
    )
    lists = whisper_options.SuppressionLists.from_model_dir(tmp_path)
    assert lists == whisper_options.SuppressionLists((1, 2), (220, 50257))
    assert whisper_options.SuppressionLists.from_model_dir(tmp_path / "none").non_speech == ()


def test_a_beam_step_reads_its_beam_as_sampled():
    """A beam step's beam is in the decoder prompt: the rules count it as already sampled, so
    the first-position suppression is over and the timestamp rules continue from it."""
    rules = DecodingRules(suppress_at_begin=(BLANK, EOT), timestamps=TimestampRules(TS, EOT))
    first = rules([], flat())
    assert first[BLANK] == -math.inf and torch.isinf(first[:TS]).all()  # a timestamp opens
    step = DecodingRules(
        suppress_at_begin=(BLANK, EOT),
        timestamps=TimestampRules(TS, EOT),
        sampled_before=(TS, TEXT),
    )
    later = DecodingRules(suppress_at_begin=(BLANK, EOT), sampled_before=(TEXT,))
    assert later([], flat())[BLANK] == 0  # not the first position any more
    assert torch.equal(step([], flat()), rules([TS, TEXT], flat()))
    assert DecodingRules.from_extra_arg(step.as_extra_arg()) == step


@pytest.mark.parametrize("repository", ["model_repository", "model_repository_gpu"])
def test_shipped_model_json_spells_out_the_decoding_defaults(repository):
    """What an operator reads in model.json is what a request without options gets."""
    import json
    from pathlib import Path

    path = Path(__file__).parents[2] / repository / "whisper_lora" / "1" / "model.json"
    task = json.loads(path.read_text())["serving"]["task"]
    assert set(task["decoding"]) | {"vad_parameters"} == set(whisper_options.DEFAULTS)
    assert whisper_options.decoding_defaults(task, VOCAB, str(path)) == whisper_options.DEFAULTS


# ---- the same rules as transformers' processors ------------------------------------------------
SOT, EN, TRANSCRIBE, NO_TS = 50258, 50259, 50359, 50363
PROMPT = [SOT, EN, TRANSCRIBE]
# whisper-base's generation_config lists: non-speech symbols and the control tokens Whisper must
# never emit (<|startoftranscript|>, <|translate|>, <|transcribe|>, <|startoflm|>, <|startofprev|>,
# <|nospeech|>); begin: " " and <|endoftext|>.
SUPPRESS = (1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92, 93)
SUPPRESS += (50258, 50358, 50359, 50360, 50361, 50362)
AT_BEGIN = (BLANK, EOT)


def transformers_processors():
    """generate()'s processors for Whisper with timestamps, in its order (begin suppression,
    suppression, timestamp rules; generation_whisper._retrieve_logit_processors)."""
    from transformers import GenerationConfig
    from transformers.generation.logits_process import (
        SuppressTokensAtBeginLogitsProcessor,
        SuppressTokensLogitsProcessor,
        WhisperTimeStampLogitsProcessor,
    )

    config = GenerationConfig(
        no_timestamps_token_id=NO_TS, eos_token_id=EOT, max_initial_timestamp_index=50
    )
    begin = len(PROMPT)
    return [
        SuppressTokensAtBeginLogitsProcessor(list(AT_BEGIN), begin),
        SuppressTokensLogitsProcessor(list(SUPPRESS)),
        WhisperTimeStampLogitsProcessor(config, begin_index=begin),
    ]


def random_history(rng: torch.Generator) -> list[int]:
    """Up to 12 sampled tokens: text, timestamps (in order or not), end of text, languages."""
    history, length = [], int(torch.randint(0, 12, (1,), generator=rng))
    for _ in range(length):
        kind = int(torch.randint(0, 10, (1,), generator=rng))
        if kind < 5:
            history.append(int(torch.randint(0, EOT, (1,), generator=rng)))
        elif kind < 9:
            history.append(TS + int(torch.randint(0, 1501, (1,), generator=rng)))
        else:
            history.append(int(torch.randint(EN, EN + 99, (1,), generator=rng)))
    return history


def random_logits(rng: torch.Generator) -> torch.Tensor:
    logits = torch.randn(VOCAB, generator=rng) * 3
    if torch.rand(1, generator=rng) < 0.5:  # timestamps likelier than any text token
        logits[TS:] += 6
    if torch.rand(1, generator=rng) < 0.3:  # a language token the likeliest
        logits[int(torch.randint(EN, EN + 99, (1,), generator=rng))] = 40
    return logits


def test_rules_equal_transformers_processors_on_random_logits():
    """Ours (one row in vLLM) and transformers' (a batch in generate()) on the same histories
    and logits: the same logits after the rules, -inf for -inf; with and without timestamps.
    openai-whisper's ApplyTimestampRules / SuppressTokens / SuppressBlank are the same rules
    (transformers ported them)."""
    rng = torch.Generator().manual_seed(0)
    with_timestamps = DecodingRules(SUPPRESS, AT_BEGIN, TimestampRules(TS, EOT))
    without = DecodingRules(SUPPRESS, AT_BEGIN)
    processors = transformers_processors()
    language_kept = 0
    for _ in range(200):
        history, logits = random_history(rng), random_logits(rng)
        input_ids = torch.tensor([PROMPT + history])
        expected = logits[None].clone()
        for processor in processors:
            expected = processor(input_ids, expected)
        got = with_timestamps(list(history), logits.clone())
        assert torch.equal(got, expected[0]), history
        plain = logits[None].clone()
        for processor in processors[:2]:
            plain = processor(input_ids, plain)
        assert torch.equal(without(list(history), logits.clone()), plain[0]), history
        language_kept += bool(torch.isfinite(got[EN : EN + 99]).any())
    assert language_kept > 25  # language tokens stay possible, as in the references
