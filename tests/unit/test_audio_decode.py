"""Audio files of every container FFmpeg reads -> 16 kHz mono, decoded with a bound.

Each file is encoded here with PyAV (FFmpeg's encoders) from one espeak-ng sentence, decoded by
`decode_audio_file`, and compared with the same sentence sent as WAV (what the server did before
PyAV): lossless codecs give the very samples, lossy ones the same signal (correlation after
aligning the codec's delay) with the length within one codec frame.
"""

import base64
import io
import os
import threading
import time
import tracemalloc

import av
import numpy as np
import pytest
import soundfile

from lora_media.audio_file import probe_audio_file
from lora_serving.audio import WHISPER_SAMPLE_RATE, decode_audio_file
from lora_serving.errors import InvalidRequest
from tests.audio_files import encode, silence_flac, with_stated_samples

SENTENCE = "The quick brown fox jumps over the lazy dog."
LIMIT_1800_BYTES = 1800 * WHISPER_SAMPLE_RATE * 4  # 115.2 MB: the limit's worth of float32


@pytest.fixture(scope="module")
def sentence(speech) -> tuple[np.ndarray, int, bytes]:
    """espeak-ng's WAV (22.05 kHz mono): samples, rate, the file."""
    path = speech(SENTENCE)
    samples, rate = soundfile.read(path, dtype="float32")
    return samples, rate, path.read_bytes()


@pytest.fixture(scope="module")
def as_wav(sentence) -> np.ndarray:
    samples, _ = decode_audio_file(sentence[2], max_seconds=30)
    return samples


def aligned_correlation(decoded: np.ndarray, reference: np.ndarray) -> tuple[float, int]:
    """Correlation after shifting by the lag that best aligns them (a codec's delay)."""
    n = min(decoded.shape[0], reference.shape[0])
    lag = int(np.argmax(np.correlate(decoded[:n], reference[:n], "full"))) - (n - 1)
    a, b = decoded[max(lag, 0) :], reference[max(-lag, 0) :]
    m = min(a.shape[0], b.shape[0])
    return float(np.corrcoef(a[:m], b[:m])[0, 1]), lag


# (label, container, codec, channels, codec rate, video codec, encoder options, lossless)
FORMATS = [
    ("wav", "wav", "pcm_s16le", 1, None, None, None, True),
    ("flac", "flac", "flac", 1, None, None, None, True),
    ("flac stereo", "flac", "flac", 2, None, None, None, True),
    ("mp3", "mp3", "libmp3lame", 1, None, None, None, False),
    ("ogg vorbis", "ogg", "vorbis", 2, 44100, None, {"strict": "experimental"}, False),
    ("ogg opus", "ogg", "libopus", 1, 48000, None, None, False),
    ("opus", "opus", "libopus", 1, 48000, None, None, False),
    ("webm opus", "webm", "libopus", 1, 48000, None, None, False),
    ("m4a aac", "ipod", "aac", 1, None, None, None, False),
    ("m4a alac", "ipod", "alac", 1, None, None, None, True),
    ("mp4 aac", "mp4", "aac", 2, None, None, None, False),
    ("mpeg mp2", "mpeg", "mp2", 1, None, None, None, False),
    ("mp4 video + aac", "mp4", "aac", 1, None, "mpeg4", None, False),
    ("mkv video + aac", "matroska", "aac", 1, None, "mpeg4", None, False),
    ("webm video + opus", "webm", "libopus", 1, 48000, "libvpx", None, False),
]


@pytest.mark.parametrize(
    "container, codec, channels, codec_rate, video, options, lossless",
    [row[1:] for row in FORMATS],
    ids=[row[0] for row in FORMATS],
)
def test_every_container_decodes_like_the_wav(
    sentence, as_wav, container, codec, channels, codec_rate, video, options, lossless
):
    samples, rate, _ = sentence
    data, frame_size = encode(
        samples, rate, container, codec, channels=channels, codec_rate=codec_rate,
        video=video, options=options,
    )  # fmt: skip
    decoded, decoded_rate = decode_audio_file(data, max_seconds=30)
    assert decoded_rate == WHISPER_SAMPLE_RATE and decoded.dtype == np.float32
    assert decoded.ndim == 1
    if lossless:
        assert decoded.shape == as_wav.shape
        assert np.abs(decoded - as_wav).max() < 1e-5
        return
    correlation, lag = aligned_correlation(decoded, as_wav)
    assert correlation > 0.98, (correlation, lag)
    # One codec frame (plus the encoder's priming, which some containers keep) at 16 kHz.
    frame_16k = (frame_size or 1152) * WHISPER_SAMPLE_RATE / (codec_rate or rate)
    assert abs(decoded.shape[0] - as_wav.shape[0]) <= frame_16k, (decoded.shape, frame_16k)
    assert abs(lag) <= frame_16k


def test_base64_of_any_container_is_accepted(sentence, as_wav):
    data, _ = encode(sentence[0], sentence[1], "ipod", "aac")
    direct, _ = decode_audio_file(data, max_seconds=30)
    encoded, _ = decode_audio_file(base64.b64encode(data), max_seconds=30)
    np.testing.assert_array_equal(direct, encoded)
    wav, _ = decode_audio_file(base64.b64encode(sentence[2]), max_seconds=30)
    np.testing.assert_array_equal(wav, as_wav)


def test_probe_reads_the_header_only(sentence):
    data, _ = encode(sentence[0], sentence[1], "webm", "libopus", codec_rate=48000)
    info = probe_audio_file(data)
    assert (info.codec, info.sample_rate, info.channels) == ("opus", 48000, 1)
    assert info.duration_s == pytest.approx(sentence[0].shape[0] / sentence[1], abs=0.03)


@pytest.mark.parametrize("container", ["matroska", "mp4", "webm"])
def test_a_video_longer_than_its_audio_is_not_truncated(sentence, as_wav, container):
    """A container's duration is its longest stream's: 8 s of video beside 3.4 s of audio."""
    samples, rate, _ = sentence
    codec, codec_rate = ("libopus", 48000) if container == "webm" else ("aac", None)
    picture = "libvpx" if container == "webm" else "mpeg4"
    data, _ = encode(
        samples, rate, container, codec, codec_rate=codec_rate, video=picture, video_seconds=8
    )
    decoded, _ = decode_audio_file(data, max_seconds=30)
    assert aligned_correlation(decoded, as_wav)[0] > 0.98


def _cut(data: bytes, fraction: float) -> bytes:
    return data[: int(len(data) * fraction)]


def bad_files(sentence) -> list[tuple[str, bytes, str]]:
    samples, rate, wav = sentence
    video_only, _ = encode(samples, rate, "mp4", None, video="mpeg4")
    webm_video, _ = encode(samples, rate, "webm", None, video="libvpx")
    mp3, _ = encode(samples, rate, "mp3", "libmp3lame")
    webm, _ = encode(samples, rate, "webm", "libopus", codec_rate=48000)
    flac, _ = encode(samples, rate, "flac", "flac")
    m4a, _ = encode(samples, rate, "ipod", "aac")
    return [
        ("empty", b"", "audio_file is empty"),
        ("garbage", b"definitely not audio", "audio_file could not be decoded"),
        ("riff garbage", b"RIFF not really a wav", "audio_file could not be decoded"),
        ("base64 of garbage", base64.b64encode(b"\x00\x01 no audio here" * 8), "could not be"),
        ("wav header only", wav[:40], "audio_file could not be decoded"),
        ("mp4 video only", video_only, r"audio_file has no audio stream \(it holds video only\)"),
        ("webm video only", webm_video, r"audio_file has no audio stream \(it holds video only\)"),
        (
            "mp3 truncated",
            _cut(mp3, 0.25),
            r"audio_file is truncated: its header states 3\.\d s of audio, it holds 0\.\d s",
        ),
        (
            "webm truncated",
            _cut(webm, 0.25),
            r"audio_file is truncated: its header states 3\.\d s of audio, it holds 0\.\d s",
        ),
        (
            "flac truncated",
            _cut(flac, 0.5),
            r"audio_file is truncated: its header states 3\.\d s of audio, it holds 1\.\d s "
            r"\(1 damaged packets skipped\)",
        ),
        # The index (moov) comes last in an m4a: cut, FFmpeg cannot open it at all.
        ("m4a truncated", _cut(m4a, 0.5), "could not be decoded .*Invalid data found"),
    ]


def test_bad_files_get_a_clear_message(sentence):
    for label, data, message in bad_files(sentence):
        with pytest.raises(InvalidRequest, match=message) as caught:
            decode_audio_file(data, max_seconds=30)
        text = str(caught.value)
        assert "object at 0x" not in text and "<_io" not in text and "<none>" not in text, (
            label,
            text,
        )


# ---- bounded decoding --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_hours() -> bytes:
    return silence_flac(7200)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """Peak growth of this process during a block: numpy/Python allocations (tracemalloc) and
    resident memory (sampled every 2 ms, so FFmpeg's own buffers count too)."""

    def __enter__(self):
        self.rss_start = self.rss_peak = _rss_bytes()
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        tracemalloc.start()
        self._sampler.start()
        self.started = time.monotonic()
        return self

    def _sample(self):
        while not self._stop.wait(0.002):
            self.rss_peak = max(self.rss_peak, _rss_bytes())

    def __exit__(self, *exc):
        self.seconds = time.monotonic() - self.started
        self.traced_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        self._stop.set()
        self._sampler.join()
        self.rss_peak = max(self.rss_peak, _rss_bytes())
        self.rss_growth = self.rss_peak - self.rss_start
        return False


def test_two_hours_of_flac_are_refused_from_the_header(two_hours):
    assert len(two_hours) < 1_500_000  # 1.2 MB that would decode to 2.7 GB at 48 kHz stereo
    with PeakMemory() as memory, pytest.raises(InvalidRequest) as caught:
        decode_audio_file(two_hours, max_seconds=1800)
    assert str(caught.value) == (
        "audio_file is longer than the 1800 s limit (its header states 7200.0 s)"
    )
    assert memory.seconds < 1.0
    assert memory.traced_peak < 5_000_000 and memory.rss_growth < 20_000_000


@pytest.mark.parametrize(
    "stated, message",
    [
        (48000 * 10, "audio_file decodes to more than the 120 s limit (its header states 10.0 s)"),
        (0, "audio_file decodes to more than the 120 s limit"),  # FLAC's "length unknown"
    ],
    ids=["header claims 10 s", "header states no length"],
)
def test_a_lying_header_is_still_bounded(two_hours, stated, message):
    """Decoding stops as soon as the audio passes the limit: memory holds about the limit's
    worth of 16 kHz float32 (7.7 MB at 120 s), never the 2 h of 48 kHz stereo (2.7 GB)."""
    lying = with_stated_samples(two_hours, stated)
    assert probe_audio_file(lying).duration_s == (10.0 if stated else None)
    with PeakMemory() as memory, pytest.raises(InvalidRequest) as caught:
        decode_audio_file(lying, max_seconds=120)
    assert str(caught.value) == message
    limit_bytes = 120 * WHISPER_SAMPLE_RATE * 4
    assert memory.traced_peak < limit_bytes + 2_000_000, memory.traced_peak
    assert memory.rss_growth < limit_bytes + 20_000_000, memory.rss_growth
    assert memory.rss_growth < LIMIT_1800_BYTES


def test_a_wav_whose_header_claims_less_than_it_holds_is_read_as_its_header_says():
    """A WAV's data chunk size is what FFmpeg reads: 1 s claimed, 60 s held -> 1 s, no more."""
    rate = 8000
    held = (np.random.default_rng(0).standard_normal(rate * 60) * 1000).astype(np.int16)
    buffer = io.BytesIO()
    soundfile.write(buffer, held, rate, format="WAV", subtype="PCM_16")
    data = bytearray(buffer.getvalue())
    at = data.index(b"data")
    data[at + 4 : at + 8] = (rate * 2).to_bytes(4, "little")  # 1 s of 16-bit mono
    decoded, _ = decode_audio_file(bytes(data), max_seconds=30)
    assert decoded.shape[0] == pytest.approx(WHISPER_SAMPLE_RATE, abs=32)


def test_decoding_within_the_limit_keeps_everything(sentence, as_wav):
    """The limit is on the decoded audio: a file just under it is kept whole."""
    data, _ = encode(sentence[0], sentence[1], "ogg", "libopus", codec_rate=48000)
    seconds = sentence[0].shape[0] / sentence[1]
    decoded, _ = decode_audio_file(data, max_seconds=seconds + 0.05)
    assert abs(decoded.shape[0] - as_wav.shape[0]) <= 320
    with pytest.raises(InvalidRequest, match="longer than the 2 s limit"):
        decode_audio_file(data, max_seconds=2)


def test_the_openai_front_reads_the_duration_from_the_same_probe(sentence):
    """verbose_json's `duration`: the container's statement (m4a, webm), None for no audio."""
    from lora_openai.audio import audio_duration

    seconds = sentence[0].shape[0] / sentence[1]
    for container, codec, rate in (("ipod", "aac", None), ("webm", "libopus", 48000)):
        data, _ = encode(sentence[0], sentence[1], container, codec, codec_rate=rate)
        assert audio_duration(data) == pytest.approx(seconds, abs=0.03)
    assert audio_duration(sentence[2]) == round(seconds, 3)
    assert audio_duration(b"definitely not audio") is None


def test_a_damaged_packet_mid_file_is_skipped(sentence, as_wav):
    """FFmpeg's tools go on past a packet its decoder refuses; so does the decoder here (in
    PyAV the error would end `container.decode`): the rest of the recording is kept."""
    data, frame_size = encode(sentence[0], sentence[1], "ipod", "aac")
    damaged = bytearray(data)
    middle = len(data) // 2
    damaged[middle : middle + 300] = bytes(300)
    with pytest.raises(av.error.InvalidDataError):  # what PyAV's own loop does with it
        with av.open(io.BytesIO(bytes(damaged))) as container:
            for _ in container.decode(audio=0):
                pass
    decoded, _ = decode_audio_file(bytes(damaged), max_seconds=30)
    assert abs(decoded.shape[0] - as_wav.shape[0]) <= 2 * frame_size
    assert aligned_correlation(decoded[-16000:], as_wav[-16000:])[0] > 0.98  # the last second
