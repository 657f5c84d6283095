"""openai-whisper's `transcribe()` quality loop for one 30 s window.

A window is decoded at the first temperature of the schedule; a result that is too repetitive
(gzip compression ratio of its text above `compression_ratio_threshold`) or too unsure (average
log-probability below `logprob_threshold`) is decoded again at the next temperature, unless the
window is judged silent: the probability of <|nospeech|> right after <|startoftranscript|> is
above `no_speech_threshold` and the log-probability is low. A silent window gives no text and
no segment. The last attempt is kept when every one fails.

The average log-probability is transformers' and openai-whisper's: the sum over the output
tokens (end of text included) of log_softmax of the logits after Whisper's decoding rules,
divided by their number, at temperature 1 (openai-whisper rescales to it; CTranslate2 gathers the
scores before the temperature). vLLM reports the log-probabilities of the distribution it sampled
from, at T; a sampled retry therefore asks for all of them and `at_temperature_one` rescales:
log_softmax(T * lp_T) = log_softmax(z) for the logits z after the decoding rules. The
compression ratio is openai-whisper's and faster-whisper's (gzip of the text's UTF-8 bytes;
transformers compresses token ids instead).

Digital silence (no sample reaches one 16-bit step) is not decoded at all: it is silent by
definition, and Whisper, asked anyway, answers "you" with a log-probability above the threshold
(openai-whisper's and transformers' rules would keep that text).

Streaming: when the schedule can retry, a window's text is released once it is accepted, so a
client never receives text that a retry replaces; with one temperature it streams token by token.
"""

import asyncio
import dataclasses
import math
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lora_serving.jobs import GenerationChunk
from lora_serving.tasks import whisper_options

# (window samples, temperature) -> the chunks of one decoding attempt (the last one finished).
Attempt = Callable[[float], AsyncIterator[GenerationChunk]]
# () -> the probability of <|nospeech|> at the window's first decoding position.
NoSpeechProbe = Callable[[], Awaitable[float]]


@dataclass(frozen=True)
class QualityRules:
    temperatures: tuple[float, ...]
    compression_ratio_threshold: float | None
    logprob_threshold: float | None
    no_speech_threshold: float | None

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "QualityRules":
        return cls(
            temperatures=whisper_options.temperatures(options["temperature"]),
            compression_ratio_threshold=options["compression_ratio_threshold"],
            logprob_threshold=options["logprob_threshold"],
            no_speech_threshold=options["no_speech_threshold"],
        )

    @property
    def may_retry(self) -> bool:
        checks = (self.compression_ratio_threshold, self.logprob_threshold)
        return len(self.temperatures) > 1 and any(value is not None for value in checks)

    def needs_fallback(self, outcome: "WindowOutcome") -> bool:
        """openai-whisper's `decode_with_fallback` test of one attempt."""
        needs = False
        ratio, logprob = self.compression_ratio_threshold, self.logprob_threshold
        if ratio is not None and outcome.compression_ratio > ratio:
            needs = True  # too repetitive
        if logprob is not None and outcome.avg_logprob < logprob:
            needs = True  # too unsure
        if self.is_silent(outcome) and logprob is not None and outcome.avg_logprob < logprob:
            needs = False  # silence: no temperature will find words
        return needs

    def is_silent(self, outcome: "WindowOutcome") -> bool:
        """openai-whisper's no-voice test: likely <|nospeech|>, unless the text is sure."""
        if self.no_speech_threshold is None or outcome.no_speech_prob is None:
            return False
        silent = outcome.no_speech_prob > self.no_speech_threshold
        if self.logprob_threshold is not None and outcome.avg_logprob > self.logprob_threshold:
            silent = False
        return silent


@dataclass
class WindowOutcome:
    """What a window's accepted attempt looked like (openai-whisper's segment fields)."""

    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float | None
    attempts: int = 1
    silent: bool = False

    def fields(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "avg_logprob": round(self.avg_logprob, 6),
            "compression_ratio": round(self.compression_ratio, 6),
            "no_speech_prob": None
            if self.no_speech_prob is None
            else round(self.no_speech_prob, 6),
        }


ONE_16_BIT_STEP = 1 / 32768


def is_digital_silence(samples: np.ndarray) -> bool:
    return samples.size == 0 or float(np.max(np.abs(samples))) < ONE_16_BIT_STEP


async def silent_window(outcomes: list[WindowOutcome]) -> AsyncIterator[GenerationChunk]:
    """A window of digital silence: no engine request, no text."""
    outcomes.append(WindowOutcome(0.0, 0.0, 0.0, None, attempts=0, silent=True))
    yield GenerationChunk("", "", [], [], 0, "stop")


def at_temperature_one(chunk: GenerationChunk, temperature: float) -> GenerationChunk:
    """A sampled attempt's chunk with each token's log-probability at temperature 1, from the
    full log-probability rows at `temperature` (top_logprobs, then dropped)."""
    if not chunk.top_logprobs:
        return chunk
    logprobs = []
    for row, token in zip(chunk.top_logprobs, chunk.token_ids, strict=False):
        scaled = temperature * np.fromiter((entry.logprob for entry in row.values()), np.float64)
        top = scaled.max()
        total = top + np.log(np.exp(scaled - top).sum())
        logprobs.append(float(temperature * row[token].logprob - total))
    return dataclasses.replace(chunk, logprobs=logprobs, top_logprobs=None)


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def average_logprob(logprobs: list[float]) -> float:
    return sum(logprobs) / len(logprobs) if logprobs else -math.inf


async def decode_window(
    attempt: Attempt,
    probe: NoSpeechProbe | None,
    rules: QualityRules,
    *,
    outcomes: list[WindowOutcome],
) -> AsyncIterator[GenerationChunk]:
    """The window's chunks (the last one finished, empty when the window is silent); appends
    the accepted attempt's WindowOutcome to `outcomes`."""
    no_speech = asyncio.ensure_future(probe()) if probe is not None else None
    live = not rules.may_retry
    try:
        for index, temperature in enumerate(rules.temperatures):
            last = None
            async for chunk in attempt(temperature):
                last = chunk
                if live and not chunk.finished:
                    yield chunk
            assert last is not None
            outcome = WindowOutcome(
                temperature=temperature,
                avg_logprob=average_logprob(last.logprobs),
                compression_ratio=compression_ratio(last.text.strip()),
                no_speech_prob=await no_speech if no_speech is not None else None,
                attempts=index + 1,
            )
            if not rules.needs_fallback(outcome):
                break
        outcome.silent = rules.is_silent(outcome)
        outcomes.append(outcome)
        if outcome.silent:
            last = GenerationChunk("", "", [], [], last.num_prompt_tokens, last.finish_reason)
        yield last
    finally:
        if no_speech is not None and not no_speech.done():
            no_speech.cancel()
