import numpy as np
import pytest

from lora_serving.errors import InvalidRequest
from lora_serving.request_inputs import RawRequest


def test_typed_accessors_per_row():
    raw = RawRequest(
        {
            "text": np.array([[b"hi"], ["h\xe9".encode()]], dtype=object),
            "flag": np.array([[True], [False]]),
            "rate": np.array([[16000], [8000]], dtype=np.int32),
        }
    )
    assert raw.batch_size == 2
    assert raw.string("text", 1) == "h\xe9"
    assert raw.boolean("flag", 1, default=True) is False
    assert raw.integer("rate", 1, default=None) == 8000
    assert raw.string("missing", 0, default="d") == "d"


@pytest.mark.parametrize(
    "tensors, call, message",
    [
        (
            {"t": np.array([[b"\xff\xfe"]], dtype=object)},
            lambda r: r.string("t", 0),
            "input 't' is not valid UTF-8",
        ),
        (
            {"t": np.array([[b"a", b"b"]], dtype=object)},
            lambda r: r.string("t", 0),
            "exactly one string",
        ),
        (
            {"f": np.array([[1]], dtype=np.int32)},
            lambda r: r.boolean("f", 0, False),
            "must be TYPE_BOOL",
        ),
        (
            {"n": np.array([[1.5]], dtype=np.float32)},
            lambda r: r.integer("n", 0, None),
            "must be an integer",
        ),
        (
            {"a": np.zeros((1, 2)), "b": np.zeros((2, 2))},
            lambda r: r.batch_size,
            "disagree on the batch dimension",
        ),
    ],
)
def test_bad_inputs_are_named(tensors, call, message):
    with pytest.raises(InvalidRequest, match=message):
        call(RawRequest(tensors))


def test_transcription_fields_carry_whisper_decoding_options():
    import json

    from lora_client.cli import _decoding
    from lora_client.requests import transcription_fields

    fields = transcription_fields(
        b"RIFF", max_tokens=8, decoding={"suppress_tokens": "", "suppress_blank": False}
    )
    assert json.loads(fields["sampling_parameters"]) == {
        "max_tokens": 8,
        "suppress_tokens": "",
        "suppress_blank": False,
    }
    assert "sampling_parameters" not in transcription_fields(b"RIFF")

    class Args:
        suppress_tokens, no_suppress_blank, vad_filter = "-1,1234", True, True
        beam_size, temperature, no_condition_on_previous_text = 5, [0.0], True
        beam_rule, hotwords, prefix = "faster-whisper", "Zyprexa", "The quick"

    assert _decoding(Args) == {
        "suppress_tokens": "-1,1234",
        "suppress_blank": False,
        "vad_filter": True,
        "beam_size": 5,
        "beam_rule": "faster-whisper",
        "temperature": 0.0,
        "condition_on_previous_text": False,
        "hotwords": "Zyprexa",
        "prefix": "The quick",
    }

    class Schedule(Args):
        beam_size, temperature, no_condition_on_previous_text = None, [0.0, 0.5], False
        beam_rule = hotwords = prefix = None

    assert _decoding(Schedule)["temperature"] == [0.0, 0.5]


def test_word_timestamps_print_one_line_per_word(capsys):
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from lora_client import openai_examples
    from lora_client.cli import _print_words, main

    segments = [
        {"start": 0.0, "end": 0.9, "text": " Hi there.", "words": [
            {"word": " Hi", "start": 0.0, "end": 0.3, "probability": 0.91},
            {"word": " there.", "start": 0.42, "end": 0.9, "probability": 0.805},
        ]},
        {"start": 61.0, "end": 61.5, "text": " Bye.", "words": [
            {"word": " Bye.", "start": 61.0, "end": 61.5, "probability": 1.0},
        ]},
    ]  # fmt: skip
    _print_words(SimpleNamespace(outputs={"segments": [json.dumps(segments)]}))
    assert capsys.readouterr().out.splitlines() == [
        "    0.00     0.30  0.910 Hi",
        "    0.42     0.90  0.805 there.",
        "   61.00    61.50  1.000 Bye.",
    ]
    # --show: the same request through the OpenAI API asks for word granularity.
    main(["transcribe", "a.wav", "--word-timestamps", "--no-word-timestamps-refine",
          "--show", "curl"])  # fmt: skip
    shown = capsys.readouterr().out
    assert "timestamp_granularities[]=segment" in shown
    assert "timestamp_granularities[]=word" in shown and "word_timestamps_refine=false" in shown
    assert "word_timestamps=" not in shown
    endpoint, fields, extra = openai_examples.speech_request(
        Path("a.wav"), "whisper_lora", word_timestamps=True
    )
    assert fields["timestamp_granularities"] == ["segment", "word"] and extra == {}
