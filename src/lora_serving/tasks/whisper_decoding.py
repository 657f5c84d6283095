"""A Whisper row's windows: their engine requests, decoding attempts and stitching.

Each window of at most 30 s (`whisper_windows`) is one engine request with the decoder prompt
Whisper was trained on:
    [<|startofprev|> previous text] <|startoftranscript|> <|xx|> <|transcribe|> [<|notimestamps|>]
An English-only model (tiny.en ... medium.en) gets no language or task tokens, as openai-whisper
and transformers prompt it:
    [<|startofprev|> previous text] <|startoftranscript|> [<|notimestamps|>]
With `timestamps`, <|notimestamps|> is left out and the engine applies Whisper's timestamp rules
(`whisper_timestamps`), so the output carries segment times.

`hotwords` and `prefix` (sampling_parameters keys) go where faster-whisper's `get_prompt` puts
them: hotwords after <|startofprev|> (before any previous text) wherever no prefix is given, the
prefix after the task tokens of the first window:
    [<|startofprev|> [hotwords] [previous text]] <|startoftranscript|> ... [prefix]

Previous text reaches Whisper in the form it was trained on (<|startofprev|> first), as
openai-whisper and transformers' `generate(prompt_ids=...)` send it: our vLLM plugin
(vllm_plugin/whisper_decoder_prompt) stops vLLM 0.32 from putting another <|startoftranscript|>
in front.

A window is decoded at the first of the request's temperatures, retried at the next ones when
its quality checks fail (`whisper_quality`), by beam search when beam_size > 1
(`whisper_beam`), and its words are aligned after it with word_timestamps
(`whisper_word_timing`).
"""

import dataclasses
import functools
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lora_serving import audio
from lora_serving.jobs import EngineSession, GenerationChunk
from lora_serving.tasks import whisper_timestamps, whisper_word_timing
from lora_serving.tasks.whisper_beam import beam_search
from lora_serving.tasks.whisper_logits import EXTRA_ARG, DecodingRules
from lora_serving.tasks.whisper_model import whisper_prompt
from lora_serving.tasks.whisper_quality import (
    at_temperature_one,
    decode_window,
    is_digital_silence,
    silent_window,
)
from lora_serving.tasks.whisper_windows import decode_seeking, decode_windows

if TYPE_CHECKING:
    from lora_serving.tasks.whisper_job import TranscriptionJob


@dataclass
class WindowPrompts:
    """What every window of a row shares once its language is known."""

    task_ids: list[int]  # <|startoftranscript|> [<|xx|> <|task|>] [<|notimestamps|>]
    sampling: dict[str, Any]  # the windows' SamplingParams kwargs (temperature set per attempt)
    rules: DecodingRules  # Whisper's decoding rules the engine applies (whisper_logits)


def window_prompts(job: "TranscriptionJob", language: str) -> WindowPrompts:
    """The decoder prompt's task part and the sampling every window of the row uses."""
    model = job.model
    task_ids = [model.special["startoftranscript"]]
    if not model.english_only:
        task_ids += [model.languages[language], model.special[job.task]]
    if not job.timestamps:
        task_ids.append(model.special["notimestamps"])
    sampling = dict(job.sampling)
    sampling.setdefault("logprobs", 0)  # the chosen tokens' (whisper_quality's average)
    everywhere, at_begin = job.suppressed
    rules = DecodingRules(
        suppress=everywhere,
        suppress_at_begin=at_begin,
        timestamps=whisper_timestamps.TimestampRules(**model.timestamp_rules)
        if job.timestamps
        else None,
    )
    if not rules.empty:
        sampling["extra_args"] = {EXTRA_ARG: rules.as_extra_arg()}
    return WindowPrompts(task_ids, sampling, rules)


def decoder_ids(job: "TranscriptionJob", previous: list[int], *, first: bool) -> list[int]:
    """faster-whisper's get_prompt: [<|startofprev|> [hotwords] [previous text]]
    <|startoftranscript|> <|xx|> <|task|> [<|notimestamps|>] [prefix, first window only]"""
    model = job.model
    prefix = job.prefix_ids if first else []
    hotwords = [] if prefix else job.hotword_ids
    ids = []
    if previous or hotwords:
        previous = previous[-(model.max_model_len // 2 - 1) :] if previous else []
        ids = [model.special["startofprev"], *hotwords, *previous]
    return ids + job.prompts.task_ids + prefix


def window_sampling(job: "TranscriptionJob", ids: list[int], temperature: float) -> dict:
    model = job.model
    # Without our plugin vLLM adds <|startoftranscript|> in front of a prompt that lacks it.
    prefixed = not model.prompt_kept() and ids[0] != model.special["startoftranscript"]
    sampling = dict(job.prompts.sampling, temperature=temperature)
    sampling["max_tokens"] = min(sampling["max_tokens"], model.max_model_len - len(ids) - prefixed)
    return sampling


def first_request(
    job: "TranscriptionJob",
    samples: np.ndarray,
    previous: list[int] | None = None,
    *,
    first: bool = True,
) -> tuple[dict, dict]:
    """The engine request (prompt, sampling) of a window's first decoding attempt (`first`:
    the row's first window, which takes the prefix)."""
    ids = decoder_ids(job, job.previous_ids if previous is None else previous, first=first)
    temperature = job.quality.temperatures[0]
    return whisper_prompt(samples, ids), window_sampling(job, ids, temperature)


class WindowDecoding:
    """One row's windows decoded through its engine session."""

    def __init__(self, job: "TranscriptionJob", engine: EngineSession):
        self.job = job
        self.model = job.model
        self.engine = engine
        self._window_numbers = iter(range(1_000_000))
        self._window_name = ""  # the window being decoded (its word alignment shares it)
        # The window `prefix` starts (prefix is refused with timestamps, so only without them).
        self._first_window = None if job.timestamps else self.windows()[0].samples

    def windows(self) -> list[audio.AudioWindow]:
        """The row's windows without timestamps: VAD's speech windows, else 30 s cuts."""
        job = self.job
        if job.speech is not None and job.speech.windows:
            return job.speech.windows
        if job.windows is None:
            job.windows = audio.split_windows(job.samples)
        return job.windows

    def chunks(self) -> AsyncIterator[GenerationChunk]:
        """The row's chunks, stitched from its windows' (whisper_windows)."""
        job, model = self.job, self.model
        separator = "" if job.language in model.no_space_languages else " "
        if not job.timestamps:
            return decode_windows(self.windows(), decode_window=self._window, separator=separator)
        return decode_seeking(
            job.samples,
            decode_window=self._window,
            read=functools.partial(whisper_timestamps.read_window, **model.timestamp_rules),
            decode=model.tokenizer.decode,
            separator=separator,
            segments=job.segments,
            outcomes=job.outcomes,
            condition_on_previous_text=job.condition_on_previous_text,
            initial_prompt=job.previous_ids,
            timestamp_begin=model.timestamp_rules["timestamp_begin"],
            align=None if job.words is None else self._align,
        )

    def _window(self, samples: np.ndarray, previous: list[int] | None = None):
        """One window's chunks: attempts at the request's temperatures, the no-speech probe."""
        job = self.job
        if is_digital_silence(samples):
            return silent_window(job.outcomes)
        ids = decoder_ids(
            job,
            job.previous_ids if previous is None else previous,
            first=samples is self._first_window,
        )
        # The name is shared by the window's requests (its word alignment too): one encoding.
        name = self._window_name = f"{job.nonce}-{next(self._window_numbers)}"
        probe = None
        if job.quality.no_speech_threshold is not None:
            probe = functools.partial(self._no_speech_prob, samples, ids, name)
        attempt = functools.partial(self._attempt, samples, ids, name)
        return decode_window(attempt, probe, job.quality, outcomes=job.outcomes)

    async def _align(self, samples, segments: list[dict], offset_s: float) -> float | None:
        return await whisper_word_timing.align(
            self.job, self.engine, samples, segments, offset_s, name=self._window_name
        )

    async def _attempt(self, samples, ids: list[int], name: str, temperature: float):
        """One decoding of a window at one temperature: the engine's chunks, or a beam search's
        result as one finished chunk."""
        job, tokenizer = self.job, self.model.tokenizer
        sampling = window_sampling(job, ids, temperature)
        prompt = whisper_prompt(samples, ids, name)
        if temperature > 0 and job.quality.may_retry:
            # Held until accepted anyway: every log-probability, to rescale to temperature 1
            # (not detokenized by vLLM: 51,865 tokens a step would cost more than the decoding).
            sampling["logprobs"] = -1
            sampling["detokenize"] = bool(sampling.get("stop"))  # stop strings need the text
            async for chunk in self.engine.stream(prompt, sampling, final_only=True):
                text = tokenizer.decode(chunk.token_ids, skip_special_tokens=True)
                chunk = dataclasses.replace(chunk, text=text, delta=text)
                yield at_temperature_one(chunk, temperature)
            return
        if temperature > 0 or job.beam.size == 1:
            async for chunk in self.engine.stream(prompt, sampling):
                yield chunk
            return
        yield await self._beam_search(samples, ids, name, sampling["max_tokens"])

    async def _beam_search(self, samples, ids: list[int], name: str, max_tokens: int):
        job = self.job
        beam, rules = job.beam, job.prompts.rules
        everywhere, at_begin = job.suppressed
        top_k = beam.top_k_needed(len(set(everywhere) | set(at_begin)))

        async def score_next(tokens: list[int]) -> dict[int, float]:
            step = {"temperature": 0.0, "max_tokens": 1, "logprobs": top_k}
            if beam.rules_in_engine and not rules.empty:  # log-probabilities after the rules
                after = dataclasses.replace(rules, sampled_before=tuple(tokens))
                step["extra_args"] = {EXTRA_ARG: after.as_extra_arg()}
            last = None
            async for chunk in self.engine.stream(
                whisper_prompt(samples, ids + tokens, name), step
            ):
                last = chunk
            return {token: entry.logprob for token, entry in last.top_logprobs[0].items()}

        result = await beam_search(
            score_next,
            options=beam,
            max_tokens=max_tokens,
            end_of_text=self.model.timestamp_rules["eot"],
            suppress=frozenset(everywhere),
            suppress_at_begin=frozenset(at_begin),
        )
        text = self.model.tokenizer.decode(result.tokens, skip_special_tokens=True)
        return GenerationChunk(
            text, text, result.tokens, result.logprobs, len(ids), result.finish_reason
        )

    async def _no_speech_prob(self, samples, ids: list[int], name: str) -> float:
        """P(<|nospeech|>) right after <|startoftranscript|> (after the previous text, if any),
        from the raw logits, as openai-whisper and transformers measure it."""
        special = self.model.special
        nospeech = special["nospeech"]
        upto = ids.index(special["startoftranscript"]) + 1
        probe = {"temperature": 0.0, "max_tokens": 1, "logprob_token_ids": [nospeech]}
        last = None
        async for chunk in self.engine.stream(whisper_prompt(samples, ids[:upto], name), probe):
            last = chunk
        return math.exp(last.top_logprobs[0][nospeech].logprob)
