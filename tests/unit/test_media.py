import base64
import io

import numpy as np
import pytest
import soundfile
from PIL import Image

from lora_serving.audio import decode_audio_file, to_whisper_input
from lora_serving.errors import InvalidRequest
from lora_serving.vision import decode_image


def encoded_audio(fmt: str, rate=22050, seconds=0.5) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    buffer = io.BytesIO()
    soundfile.write(buffer, np.stack([tone, tone], axis=1), rate, format=fmt)
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", ["WAV", "FLAC", "OGG", "MP3"])
def test_audio_files_decode_to_mono_16k(fmt):
    """libsndfile's files (stereo, 22.05 kHz) through FFmpeg: every other container is in
    test_audio_decode.py."""
    samples, rate = decode_audio_file(encoded_audio(fmt), max_seconds=30)
    assert rate == 16000 and samples.ndim == 1 and samples.dtype == np.float32
    assert to_whisper_input(samples, rate, max_seconds=30) is samples  # nothing left to do
    assert abs(len(samples) - 8000) < 1200  # 0.5 s at 16 kHz (mp3 adds codec padding)


@pytest.mark.parametrize(
    "samples, rate, message",
    [
        (np.zeros(0, np.float32), 16000, "audio is empty"),
        (np.array([0.1, np.nan], np.float32), 16000, "NaN or infinite"),
        (np.array([0.1, np.inf], np.float32), 16000, "NaN or infinite"),
        (np.zeros((2, 5), np.float32), 16000, "must be 1-D"),
        (np.zeros(5, np.int16), 16000, "must be float32"),
        (np.zeros(5, np.float32), 0, "sample_rate must be > 0"),
        (np.zeros(5, np.float32), -8000, "sample_rate must be > 0"),
        (np.zeros(16000 * 31, np.float32), 16000, "longer than the 30 s limit"),
    ],
)
def test_bad_audio_is_named(samples, rate, message):
    with pytest.raises(InvalidRequest, match=message):
        to_whisper_input(samples, rate, max_seconds=30)


def test_undecodable_audio_file():
    with pytest.raises(InvalidRequest, match="could not be decoded"):
        decode_audio_file(b"definitely not audio", max_seconds=30)


def png(size=(20, 10)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (1, 2, 3)).save(buffer, "PNG")
    return buffer.getvalue()


def test_images_raw_or_base64():
    assert decode_image(png(), index=0, max_pixels=10**6).size == (20, 10)
    assert decode_image(base64.b64encode(png()), index=0, max_pixels=10**6).size == (20, 10)
    data_url = b"data:image/png;base64," + base64.b64encode(png())
    assert decode_image(data_url, index=0, max_pixels=10**6).mode == "RGB"


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", r"image\[2\] is empty"),
        (b"!!not base64!!", "neither an encoded image"),
        (base64.b64encode(b"hello world, no image"), "could not be decoded"),
        (png((4000, 3000)), "over the limit of 1000000"),
    ],
)
def test_bad_images_are_named(data, message):
    with pytest.raises(InvalidRequest, match=message):
        decode_image(data, index=2, max_pixels=10**6)
