"""openai-whisper's quality loop for one window: checks, retries, silence, streaming."""

import asyncio
import math

import pytest

from lora_serving.jobs import GenerationChunk
from lora_serving.tasks.whisper_quality import (
    QualityRules,
    WindowOutcome,
    compression_ratio,
    decode_window,
)

DEFAULT = QualityRules((0.0, 0.2, 0.4, 0.6, 0.8, 1.0), 2.4, -1.0, 0.6)


def outcome(avg_logprob=-0.2, ratio=1.2, no_speech=0.1) -> WindowOutcome:
    return WindowOutcome(0.0, avg_logprob, ratio, no_speech)


def test_compression_ratio_is_gzip_of_the_text_as_openai_whisper():
    assert compression_ratio("") == 0.0
    assert compression_ratio("The quick brown fox.") < 1.2
    assert compression_ratio("la " * 80) > 2.4


@pytest.mark.parametrize(
    "case, fallback, silent",
    [
        (outcome(), False, False),
        (outcome(ratio=3.0), True, False),  # repetitive
        (outcome(avg_logprob=-1.5), True, False),  # unsure
        (outcome(avg_logprob=-1.5, no_speech=0.9), False, True),  # silence: no retry, no text
        (outcome(avg_logprob=-0.3, no_speech=0.9), False, False),  # sure text despite no-speech
        (outcome(ratio=3.0, avg_logprob=-1.5, no_speech=0.9), False, True),
    ],
)
def test_openai_whisper_rules(case, fallback, silent):
    assert DEFAULT.needs_fallback(case) is fallback
    assert DEFAULT.is_silent(case) is silent


def test_checks_can_be_turned_off():
    off = QualityRules((0.0, 0.5), None, None, None)
    assert not off.may_retry and not off.needs_fallback(outcome(ratio=9, avg_logprob=-9))
    assert not off.is_silent(outcome(no_speech=1.0))


def attempts_giving(texts_by_temperature, logprob=-0.1, tried=None):
    async def attempt(temperature):
        if tried is not None:
            tried.append(temperature)
        text = texts_by_temperature[temperature]
        yield GenerationChunk(text[:3], text[:3], [1], [logprob], 4)
        yield GenerationChunk(text, text[3:], [1] * 5, [logprob] * 5, 4, "stop")

    return attempt


def run(attempt, probe, rules):
    outcomes = []

    async def collect():
        return [chunk async for chunk in decode_window(attempt, probe, rules, outcomes=outcomes)]

    return asyncio.run(collect()), outcomes


def test_a_repetitive_window_is_retried_and_only_the_accepted_text_is_streamed():
    texts = {0.0: "la " * 60, 0.2: "la " * 50, 0.4: "Sing along.", 0.6: "x", 0.8: "x", 1.0: "x"}
    tried = []

    async def probe():
        return 0.05

    chunks, outcomes = run(attempts_giving(texts, tried=tried), probe, DEFAULT)
    assert tried == [0.0, 0.2, 0.4]
    assert [chunk.text for chunk in chunks] == ["Sing along."]  # nothing a retry replaced
    (accepted,) = outcomes
    assert accepted.temperature == 0.4 and accepted.attempts == 3
    assert accepted.no_speech_prob == 0.05 and accepted.avg_logprob == pytest.approx(-0.1)


def test_every_attempt_failing_keeps_the_last():
    texts = dict.fromkeys(DEFAULT.temperatures, "la " * 60)
    chunks, outcomes = run(attempts_giving(texts), None, DEFAULT)
    assert outcomes[0].temperature == 1.0 and outcomes[0].attempts == 6
    assert chunks[-1].text == "la " * 60


def test_a_silent_window_gives_no_text():
    async def probe():
        return 0.97

    chunks, outcomes = run(attempts_giving({0.0: "Thank you."}, logprob=-2.0), probe, DEFAULT)
    assert outcomes[0].silent and outcomes[0].attempts == 1
    assert chunks[-1].finished and chunks[-1].text == "" and chunks[-1].token_ids == []


def test_one_temperature_streams_live():
    rules = QualityRules((0.0,), 2.4, -1.0, None)
    chunks, outcomes = run(attempts_giving({0.0: "Hello world."}), None, rules)
    assert [chunk.delta for chunk in chunks] == ["Hel", "lo world."]
    assert outcomes[0].no_speech_prob is None and not math.isinf(outcomes[0].avg_logprob)


def test_digital_silence_is_not_decoded():
    import numpy as np

    from lora_serving.tasks.whisper_quality import is_digital_silence, silent_window

    assert is_digital_silence(np.zeros(16000, np.float32))
    assert is_digital_silence(np.full(16000, 1e-6, np.float32))
    assert not is_digital_silence(np.full(16000, 1e-3, np.float32))
    outcomes = []

    async def collect():
        return [chunk async for chunk in silent_window(outcomes)]

    (chunk,) = asyncio.run(collect())
    assert chunk.finished and chunk.text == "" and outcomes[0].silent


def test_a_sampled_attempt_is_scored_at_temperature_one():
    """log_softmax(T * log_softmax(z / T)) = log_softmax(z): openai-whisper's and
    faster-whisper's average log-probability of a sampled retry."""
    from types import SimpleNamespace

    import numpy as np

    from lora_serving.tasks.whisper_quality import at_temperature_one

    rng = np.random.default_rng(0)
    logits = [rng.normal(size=40) for _ in range(3)]
    logits[1][5] = -np.inf  # a token the decoding rules removed
    temperature, tokens = 0.6, [3, 7, 11]

    def log_softmax(z):
        return z - np.log(np.exp(z - z.max()).sum()) - z.max()

    rows = [
        {i: SimpleNamespace(logprob=v) for i, v in enumerate(log_softmax(z / temperature))}
        for z in logits
    ]
    chunk = GenerationChunk("x", "x", tokens, [-9.0] * 3, 4, "stop", top_logprobs=rows)
    rescaled = at_temperature_one(chunk, temperature)
    expected = [log_softmax(z)[t] for z, t in zip(logits, tokens, strict=True)]
    assert rescaled.logprobs == pytest.approx(expected, abs=1e-9)
    assert rescaled.top_logprobs is None
    assert at_temperature_one(GenerationChunk("x", "x", [1], [-0.5], 4), 0.6).logprobs == [-0.5]
