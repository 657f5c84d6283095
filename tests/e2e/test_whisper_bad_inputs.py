"""Every bad input gets its own error; a good request sent with it still succeeds; server stays up.

Each bad request goes out at the same moment as a good one (one gRPC stream each), so Triton's
dynamic batcher hands them to the same execute() whenever it can. Inputs whose type or shape
contradicts config.pbtxt are refused by Triton itself, before the model sees them.
"""

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.triton_calls import grpc_many, sampling

MODEL = "whisper_lora"


@pytest.fixture(scope="module")
def good(speech) -> dict:
    return {
        "audio_file": speech("Good morning.").read_bytes(),
        "language": "en",
        "sampling_parameters": sampling(max_tokens=8),
    }


def samples(*values, dtype=np.float32) -> np.ndarray:
    return np.array([values], dtype=dtype)


TONE = samples(*np.sin(np.arange(8000) / 5.0) * 0.1)
BAD = {
    "empty audio": ({"audio": np.zeros((1, 0), np.float32)}, "audio is empty"),
    "NaN sample": ({"audio": samples(0.1, np.nan, 0.2)}, "NaN or infinite"),
    "inf sample": ({"audio": samples(0.1, -np.inf)}, "NaN or infinite"),
    "FP64 audio": (
        {"audio": TONE.astype(np.float64)},
        "input 'audio' data-type is 'FP64', but model 'whisper_lora' expects 'FP32'",
    ),
    "2-D audio": (
        {"audio": np.zeros((1, 2, 8000), np.float32)},
        "unexpected shape for input 'audio' for model 'whisper_lora'",
    ),
    "audio and audio_file": (
        {"audio": TONE, "audio_file": b"RIFF...."},
        "send exactly one of 'audio' (samples) or 'audio_file' (bytes)",
    ),
    "no audio": ({"language": "en"}, "send exactly one of 'audio' (samples) or 'audio_file'"),
    "undecodable file": ({"audio_file": b"\x00\x01 not audio"}, "audio_file could not be decoded"),
    "sample_rate 0": ({"audio": TONE, "sample_rate": 0}, "sample_rate must be > 0, got 0"),
    "sample_rate < 0": ({"audio": TONE, "sample_rate": -16000}, "sample_rate must be > 0"),
    "unknown language": ({"audio": TONE, "language": "klingon"}, "unknown language 'klingon'"),
    "unknown task": ({"audio": TONE, "task": "summarize"}, "unknown task 'summarize'"),
    "malformed JSON": (
        {"audio": TONE, "sampling_parameters": '{"max_tokens": 5'},
        "sampling_parameters is not valid JSON",
    ),
    "wrong-typed JSON": (
        {"audio": TONE, "sampling_parameters": json.dumps({"temperature": "hot", "seed": 1.5})},
        "'temperature' must be a number >= 0, got \"hot\"; 'seed' must be an integer >= 0",
    ),
    "max_tokens 0": (
        {"audio": TONE, "sampling_parameters": sampling(max_tokens=0)},
        "'max_tokens' must be an integer > 0, got 0",
    ),
    "max_tokens < 0": (
        {"audio": TONE, "sampling_parameters": sampling(max_tokens=-3)},
        "'max_tokens' must be an integer > 0, got -3",
    ),
    "unknown adapter": ({"audio": TONE, "lora_name": "gamma"}, "unknown adapter 'gamma'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_fails_alone_and_its_batch_neighbour_succeeds(grpc_url, good, case):
    fields, message = BAD[case]
    bad, ok = grpc_many(grpc_url, MODEL, [(fields, None), (good, None)])
    assert bad.error is not None and message in bad.error, bad.error
    assert "good morning" in ok.text.lower()
    client = grpcclient.InferenceServerClient(grpc_url)
    assert client.is_server_ready() and client.is_model_ready(MODEL)
