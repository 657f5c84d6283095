"""A window's word timestamps (word_timestamps): one teacher-forced engine request with the row's
adapter, the window's audio and its text (vllm_plugin/whisper_alignment captures the alignment
heads), then openai-whisper's timing steps (whisper_words), then our refinement
(whisper_word_refine, where Silero VAD says the speech is)."""

import asyncio
import functools
from typing import TYPE_CHECKING

import numpy as np

from lora_serving.errors import EngineUnavailable, InvalidRequest
from lora_serving.jobs import EngineSession
from lora_serving.tasks import whisper_windows, whisper_word_refine, whisper_words
from lora_serving.tasks.whisper_model import whisper_prompt
from lora_serving.vllm_plugin.whisper_alignment import EXTRA_ARG as ALIGNMENT_EXTRA_ARG

if TYPE_CHECKING:
    from lora_serving.tasks.whisper_job import TranscriptionJob


async def align(
    job: "TranscriptionJob",
    engine: EngineSession,
    samples: np.ndarray,
    segments: list[dict],
    offset_s: float,
    *,
    name: str,
) -> float | None:
    """Add `words` to a window's segments (`name`: the window's audio, as its decoding named
    it). Returns openai-whisper's last word end (where its next window would start)."""
    model, words = job.model, job.words
    eot = model.timestamp_rules["eot"]
    text_tokens = whisper_words.window_text_tokens(segments, eot)
    if not text_tokens:
        for segment in segments:
            segment["words"] = []
        return None
    sot = job.prompts.task_ids  # <|startoftranscript|> <|xx|> <|task|> (timestamps: no more)
    ids = [*sot, model.special["notimestamps"], *text_tokens, eot]
    if len(ids) > model.max_model_len:
        raise InvalidRequest(
            f"a window's text ({len(text_tokens)} tokens) is too long to align its words"
        )
    frames = len(samples) // whisper_windows.SAMPLES_PER_FRAME  # openai-whisper's num_frames
    flag = {
        "key": f"{name}-words",
        "heads": model.alignment_heads,
        "frames": frames // 2,
        "text_from": len(sot),
        "eot": eot,
    }
    sampling = {
        "temperature": 0.0,
        "max_tokens": 1,
        "detokenize": False,
        "extra_args": {ALIGNMENT_EXTRA_ARG: flag},
    }
    last = None
    async for chunk in engine.stream(whisper_prompt(samples, ids, name), sampling, final_only=True):
        last = chunk
    result = last.alignment if last is not None else None
    if not result or "error" in result:
        why = (result or {}).get("error", "the engine gave none")
        raise EngineUnavailable(f"word timestamps could not be aligned: {why}")
    matrix = np.frombuffer(result["matrix"], dtype=np.float32).reshape(result["shape"])
    alignment = whisper_words.word_timings(
        matrix,
        result["probabilities"],
        text_tokens,
        functools.partial(
            whisper_words.split_to_word_tokens,
            decode=model.token_text,
            eot=eot,
            language=job.language,
        ),
        eot,
    )
    whisper_words.add_word_timestamps(
        segments,
        alignment,
        time_offset=offset_s,
        last_speech_timestamp=job.last_speech_s,
        prepend_punctuations=words.prepend_punctuations,
        append_punctuations=words.append_punctuations,
    )
    end = whisper_words.last_word_end(segments)
    if end is not None:
        job.last_speech_s = end
    for segment in segments:  # openai-whisper's times, before the refinement moves them
        segment["aligned"] = (segment["start"], segment["end"])
    if words.refine:
        whisper_word_refine.refine(segments, await _speech(job))
    return end


async def _speech(job: "TranscriptionJob") -> list[tuple[float, float]]:
    """Where the row's (decoded) samples hold speech, for word_timestamps_refine: Silero VAD
    once per row, off the engine loop."""
    if job.word_speech is None:
        chunks = await asyncio.to_thread(
            job.model.speech_detector.speech_chunks,
            job.samples,
            whisper_word_refine.SPEECH_OPTIONS,
        )
        job.word_speech = whisper_word_refine.speech_spans(chunks)
    return job.word_speech
