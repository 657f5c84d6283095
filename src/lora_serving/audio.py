"""Audio in any common form -> 16 kHz mono float32, what Whisper's feature extractor takes.

Files are decoded by FFmpeg through PyAV, bounded by the row's duration limit
(`lora_media.audio_file`: every container and codec FFmpeg reads); raw samples are resampled by
soxr (the high-quality resampler also used by librosa); long recordings are cut where vLLM's
own speech-to-text server cuts them (`vllm.multimodal.audio.split_audio`), so none of it is
hand-written here.
"""

from dataclasses import dataclass

import numpy as np

from lora_media.audio_file import AudioFileError
from lora_media.audio_file import decode_audio_file as _decode
from lora_serving.errors import InvalidRequest

WHISPER_SAMPLE_RATE = 16_000
WINDOW_SECONDS = 30.0  # what Whisper's encoder hears at once
# vLLM's SpeechToTextConfig defaults: look for the quietest 0.1 s in the last second of a window.
SPLIT_SEARCH_SECONDS = 1.0
SPLIT_ENERGY_WINDOW = 1600


def decode_audio_file(data: bytes, *, max_seconds: float) -> tuple[np.ndarray, int]:
    """Encoded file bytes (or their base64) -> (16 kHz mono float32 samples, 16000); a file
    FFmpeg cannot read, without audio, truncated, or longer than `max_seconds` (refused as soon
    as that shows, before or while decoding) -> InvalidRequest naming the problem."""
    try:
        return _decode(data, max_seconds=max_seconds, name="audio_file")
    except AudioFileError as err:
        raise InvalidRequest(str(err)) from None


def to_whisper_input(samples: np.ndarray, sample_rate: int, *, max_seconds: float) -> np.ndarray:
    """Validate mono samples at any rate and resample to 16 kHz float32."""
    if sample_rate <= 0:
        raise InvalidRequest(f"sample_rate must be > 0, got {sample_rate}")
    if samples.ndim != 1:
        raise InvalidRequest(
            f"audio must be 1-D mono samples per batch row, got shape {tuple(samples.shape)}"
        )
    if samples.size == 0:
        raise InvalidRequest("audio is empty")
    if not np.issubdtype(samples.dtype, np.floating):
        raise InvalidRequest(f"audio must be float32 samples, got {samples.dtype}")
    if not np.all(np.isfinite(samples)):
        raise InvalidRequest("audio contains NaN or infinite samples")
    if samples.size > max_seconds * sample_rate:
        raise InvalidRequest(f"audio is longer than the {max_seconds:g} s limit")
    samples = samples.astype(np.float32, copy=False)
    if sample_rate != WHISPER_SAMPLE_RATE:
        import soxr

        samples = soxr.resample(samples, sample_rate, WHISPER_SAMPLE_RATE).astype(np.float32)
    return samples


@dataclass(frozen=True)
class AudioWindow:
    """At most 30 s of 16 kHz samples and where they start in the whole recording."""

    offset_s: float
    samples: np.ndarray

    @property
    def duration_s(self) -> float:
        return self.samples.shape[0] / WHISPER_SAMPLE_RATE


def split_windows(samples: np.ndarray) -> list[AudioWindow]:
    """16 kHz samples -> consecutive windows of at most 30 s, cut at the quietest moment."""
    from vllm.multimodal.audio import split_audio

    if samples.shape[0] <= WINDOW_SECONDS * WHISPER_SAMPLE_RATE:
        return [AudioWindow(0.0, samples)]
    chunks = split_audio(
        samples,
        WHISPER_SAMPLE_RATE,
        max_clip_duration_s=WINDOW_SECONDS,
        overlap_duration_s=SPLIT_SEARCH_SECONDS,
        min_energy_window_size=SPLIT_ENERGY_WINDOW,
    )
    starts = np.cumsum([0] + [chunk.shape[0] for chunk in chunks[:-1]])
    return [
        AudioWindow(float(start) / WHISPER_SAMPLE_RATE, chunk)
        for start, chunk in zip(starts, chunks, strict=True)
    ]
