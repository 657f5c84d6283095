"""Audio files made in the tests with PyAV (FFmpeg's encoders; no system ffmpeg)."""

import io

import av
import numpy as np


def encode(
    samples: np.ndarray,
    rate: int,
    container: str,
    codec: str | None,
    *,
    channels: int = 1,
    codec_rate: int | None = None,
    video: str | None = None,
    video_seconds: float = 1.0,
    options: dict | None = None,
) -> tuple[bytes, int]:
    """`samples` (mono float32 at `rate`) as a `container` file of `codec` (None: no audio
    track), with an optional video track (10 frames a second); -> (file bytes, the encoder's
    frame size)."""
    buffer = io.BytesIO()
    out = av.open(buffer, "w", format=container)
    picture = None
    if video:
        picture = out.add_stream(video, rate=10)
        picture.width, picture.height, picture.pix_fmt = 64, 48, "yuv420p"
    frame_size = 0
    if codec:
        sound = out.add_stream(codec, rate=codec_rate or rate)
        sound.layout = "mono" if channels == 1 else "stereo"
        if options:
            sound.codec_context.options = options
        sample_format = sound.codec_context.codec.audio_formats[0].name
        to_codec = av.AudioResampler(sample_format, sound.layout.name, codec_rate or rate)
        planes = np.tile(samples[None].astype(np.float32), (channels, 1))
        for start in range(0, planes.shape[1], 4096):
            block = np.ascontiguousarray(planes[:, start : start + 4096])
            frame = av.AudioFrame.from_ndarray(block, format="fltp", layout=sound.layout.name)
            frame.rate, frame.pts = rate, start
            for converted in to_codec.resample(frame):
                out.mux(sound.encode(converted))
        for converted in to_codec.resample(None):
            out.mux(sound.encode(converted))
        out.mux(sound.encode(None))
        frame_size = sound.codec_context.frame_size
    if picture is not None:
        for index in range(round(video_seconds * 10)):
            still = av.VideoFrame.from_ndarray(np.zeros((48, 64, 3), np.uint8), format="rgb24")
            still = still.reformat(format="yuv420p")
            still.pts = index
            out.mux(picture.encode(still))
        out.mux(picture.encode(None))
    out.close()
    return buffer.getvalue(), frame_size


def silence_flac(seconds: int, rate: int = 48000) -> bytes:
    """`seconds` of 48 kHz stereo digital silence as FLAC (2 h: ~1.2 MB)."""
    buffer = io.BytesIO()
    out = av.open(buffer, "w", format="flac")
    sound = out.add_stream("flac", rate=rate)
    sound.layout = "stereo"
    block = av.AudioFrame.from_ndarray(np.zeros((2, rate * 10), np.int16), "s16p", "stereo")
    block.rate = rate
    for index in range(seconds // 10):
        block.pts = index * rate * 10
        out.mux(sound.encode(block))
    out.mux(sound.encode(None))
    out.close()
    return buffer.getvalue()


def with_stated_samples(flac: bytes, total: int) -> bytes:
    """The same FLAC with STREAMINFO's total-samples field (36 bits, bytes 18-25) set to
    `total` (0 = unknown): a header that lies about the length."""
    assert flac[:4] == b"fLaC"
    head = bytearray(flac)
    field = int.from_bytes(head[18:26], "big")
    head[18:26] = ((field >> 36 << 36) | total).to_bytes(8, "big")
    return bytes(head)
