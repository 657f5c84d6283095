"""Every bad input, for both models, gets its own error naming the problem; a good request sent
with it still succeeds; the server stays ready; the log shows no traceback for these errors.

Each bad request goes out at the same moment as a good one (one gRPC stream each), so Triton's
dynamic batcher hands them to the same execute() whenever it can. Inputs whose name, type or shape
contradicts config.pbtxt are refused by Triton itself, before the model sees them.
"""

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from PIL import Image

from tests.e2e.test_qwen_vl_lora import IMAGES, chat_prompt, picture, reference_text
from tests.e2e.triton_calls import grpc_many, sampling

WHISPER = "whisper_lora"
QWEN = "qwen_vl_lora"
PAYLOAD_LIMIT = 64 * 1024 * 1024  # serving.max_payload_bytes (default) of both models


# ---- inputs ------------------------------------------------------------------------------
def samples(*values, dtype=np.float32) -> np.ndarray:
    return np.array([values], dtype=dtype)


def zero_width_png() -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    header = struct.pack(">IIBBBBB", 0, 10, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def huge_png(side=5000) -> bytes:
    """A few kB that would decode to 25 megapixels (a decompression bomb in miniature)."""
    import io

    buffer = io.BytesIO()
    Image.new("L", (side, side)).save(buffer, "PNG")
    return buffer.getvalue()


TONE = samples(*np.sin(np.arange(8000) / 5.0) * 0.1)
NOT_UTF8 = b"\xff\xfe\xfa"
OVERSIZE = b"\x00" * (PAYLOAD_LIMIT + 1)


def vl(**fields) -> dict:
    return {"text_input": "Describe.", "sampling_parameters": sampling(max_tokens=4), **fields}


# case -> (model, fields, request parameters, part of the error message)
BAD = {
    # whisper_lora: audio
    "whisper: empty audio": (
        WHISPER,
        {"audio": np.zeros((1, 0), np.float32)},
        None,
        "audio is empty",
    ),
    "whisper: NaN sample": (WHISPER, {"audio": samples(0.1, np.nan, 0.2)}, None, "NaN or infinite"),
    "whisper: inf sample": (WHISPER, {"audio": samples(0.1, -np.inf)}, None, "NaN or infinite"),
    "whisper: audio and audio_file": (
        WHISPER,
        {"audio": TONE, "audio_file": b"RIFF...."},
        None,
        "send exactly one of 'audio' (samples) or 'audio_file' (bytes)",
    ),
    "whisper: no audio": (
        WHISPER,
        {"language": "en"},
        None,
        "send exactly one of 'audio' (samples) or 'audio_file'",
    ),
    "whisper: undecodable file": (
        WHISPER,
        {"audio_file": b"\x00\x01 not audio"},
        None,
        "audio_file could not be decoded",
    ),
    "whisper: oversize audio_file": (
        WHISPER,
        {"audio_file": OVERSIZE},
        None,
        f"input 'audio_file' holds {PAYLOAD_LIMIT + 1} bytes; at most {PAYLOAD_LIMIT} allowed",
    ),
    "whisper: audio longer than allowed": (
        WHISPER,
        {"audio": TONE, "sample_rate": 1},  # 8000 samples at 1 Hz: 8000 s
        None,
        "audio is longer than the 1800 s limit",
    ),
    "whisper: sample_rate 0": (
        WHISPER,
        {"audio": TONE, "sample_rate": 0},
        None,
        "sample_rate must be > 0, got 0",
    ),
    "whisper: sample_rate < 0": (
        WHISPER,
        {"audio": TONE, "sample_rate": -16000},
        None,
        "sample_rate must be > 0",
    ),
    "whisper: unknown language": (
        WHISPER,
        {"audio": TONE, "language": "klingon"},
        None,
        "unknown language 'klingon'",
    ),
    "whisper: unknown task": (
        WHISPER,
        {"audio": TONE, "task": "summarize"},
        None,
        "unknown task 'summarize'",
    ),
    "whisper: non-UTF-8 language": (
        WHISPER,
        {"audio": TONE, "language": NOT_UTF8},
        None,
        "input 'language' is not valid UTF-8",
    ),
    # whisper_lora: refused by Triton (config.pbtxt)
    "whisper: FP64 audio": (
        WHISPER,
        {"audio": TONE.astype(np.float64)},
        None,
        "input 'audio' data-type is 'FP64', but model 'whisper_lora' expects 'FP32'",
    ),
    "whisper: 2-D audio": (
        WHISPER,
        {"audio": np.zeros((1, 2, 8000), np.float32)},
        None,
        "unexpected shape for input 'audio' for model 'whisper_lora'",
    ),
    "whisper: wrong tensor name": (
        WHISPER,
        {"audio_samples": TONE},
        None,
        "unexpected inference input 'audio_samples' for model 'whisper_lora'",
    ),
    # whisper_lora: sampling parameters
    "whisper: malformed JSON": (
        WHISPER,
        {"audio": TONE, "sampling_parameters": '{"max_tokens": 5'},
        None,
        "sampling_parameters is not valid JSON",
    ),
    "whisper: wrong-typed JSON": (
        WHISPER,
        {"audio": TONE, "sampling_parameters": json.dumps({"temperature": "hot", "seed": 1.5})},
        None,
        "'temperature' must be a number in [0, 100] or a list of 1 to 16 of them (tried in "
        "order), got \"hot\"; 'seed' must be an integer >= 0",
    ),
    "whisper: max_tokens 0": (
        WHISPER,
        {"audio": TONE, "sampling_parameters": sampling(max_tokens=0)},
        None,
        "'max_tokens' must be an integer > 0, got 0",
    ),
    "whisper: max_tokens < 0": (
        WHISPER,
        {"audio": TONE, "sampling_parameters": sampling(max_tokens=-3)},
        None,
        "'max_tokens' must be an integer > 0, got -3",
    ),
    "whisper: huge max_tokens": (
        WHISPER,
        {"audio": TONE, "sampling_parameters": sampling(max_tokens=10**12)},
        None,
        "'max_tokens' must be at most 440 for this model",
    ),
    # whisper_lora: adapters
    "whisper: unknown adapter": (
        WHISPER,
        {"audio": TONE, "lora_name": "gamma"},
        None,
        "unknown adapter 'gamma'",
    ),
    "whisper: adapter path ../": (
        WHISPER,
        {"audio": TONE},
        {"lora_name": "../whisper-adapters/alpha"},
        "invalid adapter name ../whisper-adapters/alpha: use 1-64 letters",
    ),
    "whisper: adapter absolute path": (
        WHISPER,
        {"audio": TONE, "lora_name": "/etc/passwd"},
        None,
        "invalid adapter name /etc/passwd",
    ),
    "whisper: adapter name not a string": (
        WHISPER,
        {"audio": TONE},
        {"lora_name": 7},
        "request parameter 'lora_name' must be a string",
    ),
    "whisper: two different adapter names": (
        WHISPER,
        {"audio": TONE, "lora_name": "beta"},
        {"lora_name": "alpha"},
        "conflicting adapter names: request parameter lora_name='alpha', input lora_name='beta'",
    ),
    # qwen_vl_lora: media
    "qwen: undecodable image": (
        QWEN,
        vl(image=[b"\x89PNG\r\n\x1a\n" + b"x" * 64]),
        None,
        "could not be",
    ),
    "qwen: invalid base64": (QWEN, vl(image=["this is not base64!"]), None, "nor valid base64"),
    "qwen: zero-size image": (
        QWEN,
        vl(image=[zero_width_png()]),
        None,
        "image[0] has zero size (0x10)",
    ),
    "qwen: empty image": (QWEN, vl(image=[b""]), None, "image[0] is empty (0 bytes)"),
    "qwen: oversize image": (
        QWEN,
        vl(image=[OVERSIZE]),
        None,
        f"image[0] is {PAYLOAD_LIMIT + 1} bytes, over the {PAYLOAD_LIMIT} byte limit",
    ),
    "qwen: decompression bomb": (
        QWEN,
        vl(image=[huge_png()]),
        None,
        "image[0] has 5000x5000 pixels, over the limit of 16777216",
    ),
    "qwen: too many images": (
        QWEN,
        vl(image=[IMAGES[0]] * 5),
        None,
        "5 images; this model accepts at most 4",
    ),
    "qwen: video frames of two sizes": (
        QWEN,
        vl(video=[picture((56, 56)), picture((84, 56))]),
        None,
        "video frame[1] is 84x56 but frame[0] is 56x56",
    ),
    "qwen: too many video frames": (
        QWEN,
        vl(video=[picture((56, 56))] * 17),
        None,
        "17 frames; at most 16",
    ),
    "qwen: video_fps 0": (
        QWEN,
        vl(video=[picture((56, 56))] * 2, video_fps=np.zeros((1, 1), np.float32)),
        None,
        "video_fps must be > 0, got 0",
    ),
    # qwen_vl_lora: prompt
    "qwen: empty prompt, no image": (QWEN, vl(text_input=""), None, "empty request"),
    "qwen: placeholders, no template, no image": (
        QWEN,
        vl(text_input="<|vision_start|><|image_pad|><|vision_end|>Hi", apply_chat_template=False),
        None,
        "text_input has 1 <|image_pad|> placeholder(s) but the request carries 0 image(s)",
    ),
    "qwen: non-UTF-8 text_input": (
        QWEN,
        vl(text_input=NOT_UTF8),
        None,
        "input 'text_input' is not valid UTF-8",
    ),
    # qwen_vl_lora: refused by Triton (config.pbtxt)
    "qwen: text_input of two strings": (
        QWEN,
        vl(text_input=["a", "b"]),
        None,
        "unexpected shape for input 'text_input' for model 'qwen_vl_lora'",
    ),
    "qwen: INT32 text_input": (
        QWEN,
        vl(text_input=3),
        None,
        "input 'text_input' data-type is 'INT32', but model 'qwen_vl_lora' expects 'BYTES'",
    ),
    "qwen: wrong tensor name": (
        QWEN,
        vl(images=[IMAGES[0]]),
        None,
        "unexpected inference input 'images' for model 'qwen_vl_lora'",
    ),
    # qwen_vl_lora: sampling parameters and adapters
    "qwen: malformed sampling_parameters": (
        QWEN,
        vl(sampling_parameters='{"max_tokens": 4,'),
        None,
        "sampling_parameters is not valid JSON",
    ),
    "qwen: unknown sampling key": (
        QWEN,
        vl(sampling_parameters='{"top_p": 7, "beam": 2}'),
        None,
        "unknown key 'beam'",
    ),
    "qwen: non-UTF-8 sampling_parameters": (
        QWEN,
        vl(sampling_parameters=NOT_UTF8),
        None,
        "input 'sampling_parameters' is not valid UTF-8",
    ),
    "qwen: huge max_tokens": (
        QWEN,
        vl(sampling_parameters=sampling(max_tokens=2**63)),
        None,
        "'max_tokens' must be at most",
    ),
    "qwen: unknown adapter": (
        QWEN,
        vl(image=[IMAGES[0]]),
        {"lora_name": "gamma"},
        "unknown adapter 'gamma'",
    ),
    "qwen: adapter path trick": (
        QWEN,
        vl(),
        {"lora_name": "alpha/../../beta"},
        "invalid adapter name alpha/../../beta",
    ),
    "qwen: adapter name with NUL": (
        QWEN,
        vl(lora_name="alpha\x00"),
        None,
        "invalid adapter name 'alpha\\x00'",
    ),
    "qwen: adapter command with inputs": (
        QWEN,
        vl(adapter_command="list"),
        None,
        "an adapter_command request carries no other inputs",
    ),
}


# ---- good neighbours ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def good(speech, demo_models) -> dict:
    """model -> (fields, parameters, check of the served text)."""
    base, adapters = demo_models / "qwen2-vl-tiny", demo_models / "qwen2-vl-adapters"
    prompt = chat_prompt(base, "Describe this image.", images=1)
    qwen_text = reference_text(base, adapters, "beta", prompt, [IMAGES[0]])
    whisper_fields = {
        "audio_file": speech("Good morning.").read_bytes(),
        "language": "en",
        "sampling_parameters": sampling(max_tokens=8),
    }
    qwen_fields = {
        "text_input": "Describe this image.",
        "image": [IMAGES[0]],
        "exclude_input_in_output": True,
        "sampling_parameters": sampling(max_tokens=16),
    }
    return {
        WHISPER: (whisper_fields, None, lambda text: "good morning" in text.lower()),
        QWEN: (qwen_fields, {"lora_name": "beta"}, lambda text: text == qwen_text),
    }


@pytest.fixture(scope="module")
def log_start(triton_server) -> int:
    """Where the server log stood before this module's requests."""
    return triton_server.log_path.stat().st_size


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_fails_alone_and_its_batch_neighbour_succeeds(grpc_url, good, log_start, case):
    model, fields, parameters, message = BAD[case]
    good_fields, good_parameters, is_right = good[model]
    bad, ok = grpc_many(grpc_url, model, [(fields, parameters), (good_fields, good_parameters)])
    assert bad.error is not None and message in bad.error, bad.error
    assert is_right(ok.text), ok.text
    client = grpcclient.InferenceServerClient(grpc_url)
    assert client.is_server_ready() and client.is_model_ready(model)


def test_expected_errors_leave_no_traceback_in_the_log(triton_server, log_start):
    """Runs after the cases above (file order): what they logged holds no traceback."""
    with open(triton_server.log_path, "rb") as log:
        log.seek(log_start)
        written = log.read().decode("utf-8", "replace")
    assert "Traceback" not in written, written[written.index("Traceback") - 2000 :][:6000]
    assert "unexpected error" not in written
