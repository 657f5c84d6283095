"""Audio files of any container and codec FFmpeg reads -> 16 kHz mono float32, bounded.

FFmpeg decodes through PyAV (wav, flac, mp3, ogg/vorbis/opus, webm, m4a/mp4 with AAC or ALAC,
mpeg, and the first audio stream of a video), as faster-whisper's `decode_audio` does: the
first audio stream, frame by frame, the container closed at the end. Channels are averaged and
soxr resamples to 16 kHz as the frames arrive (soxr's streaming resampler gives the very
samples its one-shot `soxr.resample` gives, so a WAV decodes as it did with libsndfile).

Decoding is bounded: a file that states a duration over the limit is refused before decoding,
any other stops as soon as its decoded audio passes the limit, and the samples go into one
buffer that grows in place up to the limit's worth of 16 kHz float32, whatever the file's size
or what its header claims.

Shared by whisper_lora (lora_serving.audio) and the OpenAI front (lora_openai, which never
imports lora_serving): it raises its own AudioFileError, with messages meant for the client.
"""

import base64
import binascii
import io
import math
import string
from dataclasses import dataclass

import numpy as np

SAMPLE_RATE = 16_000  # Whisper's
# A file whose header states more audio than it holds by this much is refused as truncated
# (both bounds: stated durations of some formats are estimates from the bitrate).
TRUNCATED_MIN_GAP_S = 1.0
TRUNCATED_FRACTION = 0.9
BLOCK_SAMPLES = 32_768  # decoded samples converted at once (< 1 s at 48 kHz)
_FIRST_CAPACITY_S = 30.0  # the 16 kHz buffer's first size when the header states no duration
_BASE64_ALPHABET = frozenset((string.ascii_letters + string.digits + "+/=").encode())
FORMATS_HINT = "wav, flac, mp3, ogg, opus, webm, m4a, mp4, mpeg or any audio FFmpeg decodes"


class AudioFileError(Exception):
    """The file cannot be used; the message names the problem (no Python reprs)."""


@dataclass(frozen=True)
class AudioInfo:
    """What a file's container says about its first audio stream, read without decoding."""

    codec: str
    sample_rate: int
    channels: int
    duration_s: float | None  # None: the container does not state it


def _file_bytes(data: bytes, name: str) -> bytes:
    if not data:
        raise AudioFileError(f"{name} is empty")
    # HTTP/JSON clients (Triton's generate endpoint) can only send text: accept base64. Binary
    # containers start with bytes outside base64's alphabet (sizes, NULs, magic numbers).
    if _BASE64_ALPHABET.issuperset(data[:16]):
        try:
            return base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            pass  # not base64 after all: FFmpeg says what it is
    return data


def _ffmpeg_reason(err: Exception) -> str:
    """FFmpeg's own words for an error, never a Python repr (PyAV's str() names the file
    object)."""
    reason = getattr(err, "strerror", None) or type(err).__name__
    return str(reason).rstrip(".")


def _open(data: bytes, name: str):
    import av

    try:
        container = av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except (av.error.FFmpegError, ValueError, OSError) as err:
        raise AudioFileError(
            f"{name} could not be decoded ({FORMATS_HINT} expected): FFmpeg: {_ffmpeg_reason(err)}"
        ) from None
    if not container.streams.audio:
        kinds = sorted({stream.type for stream in container.streams})
        container.close()
        held = f" (it holds {', '.join(kinds)} only)" if kinds else ""
        raise AudioFileError(f"{name} has no audio stream{held}")
    return container


def _stated_duration(container, stream) -> float | None:
    """The audio stream's own duration, else the container's when the audio is all it holds
    (a container's duration is its longest stream's: a video's audio can be shorter)."""
    if stream.duration is not None and stream.time_base is not None and stream.duration > 0:
        return float(stream.duration * stream.time_base)
    if len(container.streams) == 1 and container.duration is not None and container.duration > 0:
        return container.duration / 1_000_000  # AV_TIME_BASE
    return None


def _info(container) -> AudioInfo:
    stream = container.streams.audio[0]
    context = stream.codec_context
    return AudioInfo(
        codec=context.name,
        sample_rate=int(context.sample_rate or 0),
        channels=int(context.channels or 0),
        duration_s=_stated_duration(container, stream),
    )


def probe_audio_file(data: bytes, *, name: str = "audio_file") -> AudioInfo:
    """The first audio stream's codec, rate, channels and stated duration, without decoding;
    AudioFileError when FFmpeg cannot read the file or it holds no audio."""
    container = _open(_file_bytes(data, name), name)
    try:
        return _info(container)
    finally:
        container.close()


class _Samples16k:
    """A float32 buffer that grows in place (realloc) up to a fixed capacity: the limit's worth
    of 16 kHz samples, never more."""

    def __init__(self, first: int, limit: int | None):
        self.limit = limit
        self.data = np.empty(max(1, first if limit is None else min(first, limit)), np.float32)
        self.size = 0

    def append(self, chunk: np.ndarray) -> bool:
        """False when the chunk would pass the limit (nothing is kept then)."""
        end = self.size + chunk.shape[0]
        if self.limit is not None and end > self.limit:
            return False
        if end > self.data.shape[0]:
            grown = max(end, 2 * self.data.shape[0])
            if self.limit is not None:
                grown = min(grown, self.limit)
            self.data.resize(grown, refcheck=False)  # no views of it exist
        self.data[self.size : end] = chunk
        self.size = end
        return True

    def result(self) -> np.ndarray:
        self.data.resize(self.size, refcheck=False)
        return self.data


def _frames(container, stream, skipped: list[int]):
    """The stream's decoded frames; a packet its decoder refuses is skipped (counted in
    `skipped`), as FFmpeg's own tools go on past a damaged packet (in PyAV an error ends
    `container.decode`, so faster-whisper's `_ignore_invalid_frames` stops there instead)."""
    import av

    for packet in container.demux(stream):
        try:
            frames = packet.decode()
        except av.error.InvalidDataError:
            skipped.append(packet.pts or 0)
            continue
        yield from frames


def _blocks(frames):
    """Decoded frames gathered into blocks of about BLOCK_SAMPLES (faster-whisper's
    `_group_frames`: an Opus frame is 20 ms, and each costs Python work), each yielded with the
    converter to planar float32 of its shape and whether the shape is new."""
    import av

    fifo = to_float = shape = None
    new = True
    for frame in frames:
        key = (frame.format.name, frame.layout.name, frame.sample_rate)
        if key != shape:
            if fifo is not None and fifo.samples:
                yield fifo.read(), to_float, shape[2], new
            fifo, shape = av.AudioFifo(), key
            to_float = av.AudioResampler(format="fltp")  # sample format only
            new = True
        frame.pts = None  # the FIFO checks timestamps otherwise
        fifo.write(frame)
        if fifo.samples >= BLOCK_SAMPLES:
            yield fifo.read(), to_float, shape[2], new
            new = False
    if fifo is not None and fifo.samples:
        yield fifo.read(), to_float, shape[2], new


def decode_audio_file(
    data: bytes, *, max_seconds: float, name: str = "audio_file"
) -> tuple[np.ndarray, int]:
    """Encoded file bytes (or their base64) -> (16 kHz mono float32 samples, 16000).

    Refuses (AudioFileError, naming the problem) a file FFmpeg cannot read, one with no audio
    stream, one whose header states more than `max_seconds`, one whose decoded audio passes
    `max_seconds` (decoding stops there), and one that holds much less audio than its header
    states (truncated).
    """
    import av
    import soxr

    container = _open(_file_bytes(data, name), name)
    try:
        stream = container.streams.audio[0]
        info = _info(container)
        stated = info.duration_s
        if stated is not None and stated > max_seconds:
            raise AudioFileError(
                f"{name} is longer than the {max_seconds:g} s limit (its header states "
                f"{stated:.1f} s)"
            )
        limit = None if math.isinf(max_seconds) else int(max_seconds * SAMPLE_RATE)
        first = (stated if stated is not None else _FIRST_CAPACITY_S) * 1.05 + 1.0
        samples = _Samples16k(int(first * SAMPLE_RATE), limit)
        resampler = None
        decoded_s = 0.0

        def keep(chunk: np.ndarray) -> None:
            if not samples.append(chunk):
                raise AudioFileError(
                    f"{name} decodes to more than the {max_seconds:g} s limit"
                    + (f" (its header states {stated:.1f} s)" if stated is not None else "")
                )

        try:
            skipped: list[int] = []
            for block, to_float, rate, changed in _blocks(_frames(container, stream, skipped)):
                if changed:  # the first block, or the stream changed its rate or layout
                    if resampler is not None:
                        keep(resampler.resample_chunk(np.zeros(0, np.float32), last=True))
                    resampler = (
                        soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32")
                        if rate != SAMPLE_RATE
                        else None
                    )
                for converted in to_float.resample(block):
                    mono = converted.to_ndarray().mean(axis=0, dtype=np.float32)
                    decoded_s += mono.shape[0] / rate
                    keep(mono if resampler is None else resampler.resample_chunk(mono))
        except (av.error.FFmpegError, ValueError) as err:  # ValueError: PyAV's own checks
            raise AudioFileError(
                f"{name} is damaged or truncated after {decoded_s:.1f} s of audio: FFmpeg: "
                f"{_ffmpeg_reason(err)}"
            ) from None
        if resampler is not None:
            keep(resampler.resample_chunk(np.zeros(0, np.float32), last=True))
    finally:
        container.close()
    if samples.size == 0:
        raise AudioFileError(f"{name} holds no audio samples (empty or truncated)")
    held = samples.size / SAMPLE_RATE
    if (
        stated is not None
        and stated - held > TRUNCATED_MIN_GAP_S
        and held < TRUNCATED_FRACTION * stated
    ):
        damaged = f" ({len(skipped)} damaged packets skipped)" if skipped else ""
        raise AudioFileError(
            f"{name} is truncated: its header states {stated:.1f} s of audio, it holds "
            f"{held:.1f} s{damaged}"
        )
    return samples.result(), SAMPLE_RATE
