"""One batch row of a Whisper request: what it asked for, what its decoding found, and `run`,
which drives the engine for it step by step.

`run` reads top to bottom: voice activity detection (vad_filter) -> language detection (when
the request named none) -> the windows' decoding (whisper_decoding.WindowDecoding) -> segment
times mapped back to the original recording (after VAD).
"""

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lora_serving import audio
from lora_serving.adapters.catalog import Adapter
from lora_serving.jobs import EngineSession, GenerationChunk, SentTokens
from lora_serving.tasks import whisper_decoding, whisper_vad
from lora_serving.tasks.whisper_beam import BeamOptions
from lora_serving.tasks.whisper_decoding import WindowPrompts
from lora_serving.tasks.whisper_model import WhisperModel, whisper_prompt
from lora_serving.tasks.whisper_quality import QualityRules, WindowOutcome


@dataclass(frozen=True)
class WordOptions:
    """word_timestamps' options (openai-whisper's, plus our refinement)."""

    prepend_punctuations: str
    append_punctuations: str
    refine: bool

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "WordOptions":
        return cls(
            options["prepend_punctuations"],
            options["append_punctuations"],
            options["word_timestamps_refine"],
        )


@dataclass
class TranscriptionJob:
    # ---- asked for (whisper_request.py) ------------------------------------------------------
    model: WhisperModel = field(repr=False)
    adapter: Adapter | None
    samples: np.ndarray  # 16 kHz mono; after VAD, the speech only
    sampling: dict[str, Any]  # the request's SamplingParams kwargs
    task: str  # "transcribe" | "translate"
    language: str | None  # a language code; None until detected
    timestamps: bool
    previous_ids: list[int]  # `prompt`: text said before the recording
    hotword_ids: list[int]
    prefix_ids: list[int]
    suppressed: tuple[list[int], list[int]]  # (everywhere, at the beginning)
    quality: QualityRules
    beam: BeamOptions
    condition_on_previous_text: bool
    words: WordOptions | None  # word_timestamps
    vad: whisper_vad.VadOptions | None  # vad_filter
    outputs: frozenset[str]  # additional outputs asked for
    nonce: str = field(default_factory=lambda: uuid.uuid4().hex)  # names its windows' audio
    # ---- found while running -----------------------------------------------------------------
    prompts: WindowPrompts | None = None  # set once the language is known
    speech: whisper_vad.Speech | None = None  # what VAD found
    windows: list[audio.AudioWindow] | None = None  # plain transcripts: the windows decoded
    segments: list[dict] = field(default_factory=list)  # filled while decoding with timestamps
    outcomes: list[WindowOutcome] = field(default_factory=list)  # each window's accepted attempt
    last_speech_s: float = 0.0  # word timestamps: the last word's end so far
    word_speech: list[tuple[float, float]] | None = None  # word refinement: where speech is
    sent: SentTokens = field(default_factory=SentTokens)

    async def run(self, engine: EngineSession) -> AsyncIterator[GenerationChunk]:
        if self.vad is not None:
            self.speech = await whisper_vad.find_speech(
                self.model.speech_detector, self.samples, self.vad, timestamps=self.timestamps
            )
            if not self.speech.chunks:
                async for chunk in whisper_vad.no_speech():
                    yield chunk
                return
            self.samples = self.speech.samples
        if self.prompts is None:
            await self.detect_language(engine)
        chunks = whisper_decoding.WindowDecoding(self, engine).chunks()
        if self.speech is not None and self.timestamps:
            speech_map = whisper_vad.SpeechMap(self.speech.chunks)
            chunks = whisper_vad.restoring(chunks, speech_map, self.segments)
        async for chunk in chunks:
            yield chunk

    async def detect_language(self, engine: EngineSession) -> None:
        """Whisper's own detection on the first 30 s: the likeliest language token."""
        model = self.model
        first = self.samples[: int(audio.WINDOW_SECONDS * audio.WHISPER_SAMPLE_RATE)]
        chunk = await engine.generate(
            whisper_prompt(first, [model.special["startoftranscript"]]),
            {
                "temperature": 0.0,
                "max_tokens": 1,
                "allowed_token_ids": list(model.languages.values()),
            },
        )
        by_id = {token: code for code, token in model.languages.items()}
        self.use_language(by_id[chunk.token_ids[0]])

    def use_language(self, language: str) -> None:
        self.language = language
        self.prompts = whisper_decoding.window_prompts(self, language)
