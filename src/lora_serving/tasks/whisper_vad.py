"""Voice activity detection for Whisper (`vad_filter`), the way faster-whisper does it.

Silero VAD (the `silero-vad` package's own ONNX model on onnxruntime, loaded once per model
instance) finds the speech in a row's recording. Everything else is dropped before decoding:
- with timestamps, the speech chunks are joined and decoded window after window as usual; the
  segment times are then mapped back to the original recording (`SpeechMap`, faster-whisper's
  `SpeechTimestampsMap`), so they still say where the words are in what the client sent;
- without timestamps, the chunks are packed in recording order into windows of at most 30 s
  (faster-whisper's `collect_chunks`), so long recordings are cut between speech chunks, never
  inside one (a single chunk longer than 30 s is cut at its quietest moment, as without VAD).
A recording without speech gives an empty transcript and no engine request at all.

`vad_parameters` are faster-whisper's `VadOptions` with its defaults; keys a request leaves out
take those defaults. Silero's detector runs with faster-whisper's cut rule for over-long chunks
(the last silence of at least 98 ms; `use_max_poss_sil_at_max_speech=False`).
"""

import asyncio
import bisect
import math
import threading
import warnings
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lora_serving.audio import WHISPER_SAMPLE_RATE, WINDOW_SECONDS, AudioWindow, split_windows
from lora_serving.jobs import GenerationChunk
from lora_serving.sampling import Field

DEFAULTS = {"vad_filter": False, "vad_parameters": {}}
# A kept stretch of the recording: [start, end) in 16 kHz samples.
Chunk = tuple[int, int]


@dataclass(frozen=True)
class VadOptions:
    """faster-whisper's VadOptions (faster_whisper/vad.py) and its defaults."""

    threshold: float = 0.5  # speech probability at or above which a frame is speech
    neg_threshold: float | None = None  # below it speech ends; None: max(threshold - 0.15, 0.01)
    min_speech_duration_ms: float = 0  # shorter speech chunks are dropped
    max_speech_duration_s: float = math.inf  # longer ones are cut at their last silence
    min_silence_duration_ms: float = 2000  # silence that ends a speech chunk
    speech_pad_ms: float = 400  # kept on each side of a speech chunk

    @classmethod
    def from_dict(cls, given: dict[str, Any]) -> "VadOptions":
        """A `vad_parameters` object (checked with `problems`) -> options."""
        return cls(**given)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


# vad_parameters key -> its rule on a number (neg_threshold may also be null)
_RULES = {
    "threshold": lambda x: 0 < x < 1,
    "neg_threshold": lambda x: 0 <= x <= 1,
    "min_speech_duration_ms": lambda x: 0 <= x < math.inf,
    "max_speech_duration_s": lambda x: x > 0,
    "min_silence_duration_ms": lambda x: 0 <= x < math.inf,
    "speech_pad_ms": lambda x: 0 <= x < math.inf,
}


def valid_parameters(value: Any) -> bool:
    """Whether a `vad_parameters` value holds only VadOptions keys with allowed values."""
    if not isinstance(value, dict) or not set(value) <= set(_RULES):
        return False
    for key, item in value.items():
        if key == "neg_threshold" and item is None:
            continue
        if not _number(item) or not _RULES[key](item):
            return False
    negative = value.get("neg_threshold")
    return negative is None or negative <= value.get("threshold", VadOptions.threshold)


def task_fields() -> dict[str, Field]:
    """The `sampling_parameters` keys (and model.json `serving.task.decoding` defaults)."""
    return {
        "vad_filter": ((bool,), lambda v: True, "true or false"),
        "vad_parameters": (
            (dict,),
            valid_parameters,
            "an object with any of threshold (0 < x < 1), neg_threshold (null or "
            "0 <= x <= threshold), min_speech_duration_ms, min_silence_duration_ms, "
            "speech_pad_ms (numbers >= 0), max_speech_duration_s (a number > 0)",
        ),
    }


class SpeechDetector:
    """Silero VAD's ONNX model, loaded once; `speech_chunks` may be called from any thread.

    The model keeps recurrent state between 32 ms frames, so calls take turns (a lock); its
    onnxruntime session runs on one thread (silero-vad's setting), about 0.2 s per minute of
    audio on this project's CPUs.
    """

    def __init__(self):
        import torch

        threads = torch.get_num_threads()
        with warnings.catch_warnings():  # its loader's importlib.resources.path deprecation
            warnings.simplefilter("ignore", DeprecationWarning)
            from silero_vad import get_speech_timestamps, load_silero_vad

            self._model = load_silero_vad(onnx=True)
        # Importing silero_vad sets torch's process-wide thread count to 1: keep ours.
        torch.set_num_threads(threads)
        self._detect = get_speech_timestamps
        self._lock = threading.Lock()

    def speech_chunks(self, samples: np.ndarray, options: VadOptions) -> list[Chunk]:
        """16 kHz samples -> the speech chunks to keep, padded, in recording order."""
        import torch

        with self._lock:
            found = self._detect(
                torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32)),
                self._model,
                sampling_rate=WHISPER_SAMPLE_RATE,
                use_max_poss_sil_at_max_speech=False,
                **asdict(options),
            )
        return [(int(chunk["start"]), int(chunk["end"])) for chunk in found]


def gather(samples: np.ndarray, chunks: list[Chunk]) -> np.ndarray:
    """The kept chunks joined, in recording order."""
    return np.concatenate([samples[start:end] for start, end in chunks])


class SpeechMap:
    """Times in the joined speech -> times in the original recording (faster-whisper's
    SpeechTimestampsMap: each chunk moves by the silence dropped before it)."""

    def __init__(self, chunks: list[Chunk], sample_rate: int = WHISPER_SAMPLE_RATE):
        self.sample_rate = sample_rate
        self.chunk_ends: list[int] = []  # in joined samples
        self.dropped_before: list[float] = []  # seconds dropped before each chunk
        previous_end = dropped = 0
        for start, end in chunks:
            dropped += start - previous_end
            previous_end = end
            self.chunk_ends.append(end - dropped)
            self.dropped_before.append(dropped / sample_rate)

    def original_time(self, time_s: float, *, is_end: bool = False) -> float:
        """A start (or, with is_end, an end) time in the joined speech -> original seconds.

        A time on the border of two chunks belongs to the next one, an end time to the one
        it ends."""
        sample = round(time_s * self.sample_rate)
        if is_end and sample in self.chunk_ends:
            index = self.chunk_ends.index(sample)
        else:
            index = min(bisect.bisect(self.chunk_ends, sample), len(self.chunk_ends) - 1)
        return round(self.dropped_before[index] + time_s, 2)

    def restore(self, segments: list[dict]) -> None:
        """Rewrite {start, end, text} segments and their words, in place, to original times."""
        for segment in segments:
            for timed in [segment, *segment.get("words", ())]:
                timed["start"] = self.original_time(timed["start"])
                timed["end"] = self.original_time(timed["end"], is_end=True)


def speech_windows(samples: np.ndarray, chunks: list[Chunk]) -> list[AudioWindow]:
    """The kept chunks packed, in recording order, into windows of at most 30 s.

    A window's `offset_s` is where its first chunk starts in the original recording."""
    limit = int(WINDOW_SECONDS * WHISPER_SAMPLE_RATE)
    pieces: list[AudioWindow] = []
    for start, end in chunks:
        offset_s = start / WHISPER_SAMPLE_RATE
        if end - start > limit:
            pieces += [
                AudioWindow(offset_s + window.offset_s, window.samples)
                for window in split_windows(samples[start:end])
            ]
        else:
            pieces.append(AudioWindow(offset_s, samples[start:end]))
    windows: list[AudioWindow] = []
    group: list[AudioWindow] = []
    for piece in pieces:
        if group and sum(len(p.samples) for p in group) + len(piece.samples) > limit:
            windows.append(_joined(group))
            group = []
        group.append(piece)
    if group:
        windows.append(_joined(group))
    return windows


def _joined(pieces: list[AudioWindow]) -> AudioWindow:
    return AudioWindow(pieces[0].offset_s, np.concatenate([piece.samples for piece in pieces]))


@dataclass
class Speech:
    """What detection found in a row's recording."""

    chunks: list[Chunk]  # kept stretches of the original recording; [] means no speech
    samples: np.ndarray  # the kept chunks joined (what Whisper hears)
    windows: list[AudioWindow] | None  # plain transcripts: the chunks packed into windows


async def find_speech(
    detector: SpeechDetector, samples: np.ndarray, options: VadOptions, *, timestamps: bool
) -> Speech:
    """Run detection in a worker thread (it takes ~0.2 s per minute of audio, too long for the
    engine loop). With timestamps the joined speech is decoded window after window as usual;
    without, its windows are packed from the chunks (see the module docstring)."""
    chunks = await asyncio.to_thread(detector.speech_chunks, samples, options)
    if not chunks:
        return Speech([], samples[:0], None)
    windows = None if timestamps else speech_windows(samples, chunks)
    return Speech(chunks, gather(samples, chunks), windows)


async def no_speech() -> AsyncIterator[GenerationChunk]:
    """A row without speech: an empty transcript, no engine request at all."""
    yield GenerationChunk("", "", [], [], 0, finish_reason="stop")


async def restoring(
    chunks: AsyncIterator[GenerationChunk], speech: SpeechMap, segments: list[dict]
) -> AsyncIterator[GenerationChunk]:
    """The row's chunks unchanged; before the last one, its segments move to original times."""
    async for chunk in chunks:
        if chunk.finished:
            speech.restore(segments)
        yield chunk
