"""The OpenAI front's pure parts (lora_openai): request mapping, srt/vtt/verbose_json, SSE event
shapes, error mapping, and the app's routes against a fake gateway (no Triton, no server)."""

import ast
import json
from pathlib import Path

import jinja2
import pytest
from fastapi.testclient import TestClient

from lora_openai import audio, chat
from lora_openai.app import FrontSettings, create_app
from lora_openai.errors import OpenAIError, from_triton
from lora_openai.limits import BodySizeLimit
from lora_openai.models import parse_model_id
from lora_openai.triton import Reply
from tests.conftest import DEMO

FRONT = Path(__file__).resolve().parents[2] / "src" / "lora_openai"
SEGMENTS = [
    {"start": 0.0, "end": 2.5, "text": " The quick brown fox.", "avg_logprob": -0.2},
    {"start": 2.5, "end": 3661.25, "text": " A --> B", "temperature": 0.2},
]


@pytest.mark.parametrize("path", sorted(FRONT.glob("*.py")), ids=lambda p: p.name)
def test_the_front_never_imports_the_serving_core(path):
    tree = ast.parse(path.read_text())
    modules = {alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in modules if m.split(".")[0] == "lora_serving"}, path


# ---- audio ---------------------------------------------------------------------------------------
def form(**fields) -> list[tuple[str, str]]:
    return [("model", "whisper_lora/alpha"), *fields.items()]


def test_hotwords_and_prefix_stay_text():
    request = audio.parse_form(
        "transcribe", form(hotwords="2024", prefix="Zyprexa, 10 mg", beam_size="5"), b"RIFF"
    )
    assert json.loads(request.triton_fields()["sampling_parameters"]) == {
        "hotwords": "2024",
        "prefix": "Zyprexa, 10 mg",
        "beam_size": 5,
    }


def test_transcription_form_maps_to_whisper_inputs():
    request = audio.parse_form(
        "transcribe",
        form(language="de", prompt="Vorher", response_format="verbose_json", beam_size="5")
        + [("suppress_tokens", "-1,1234"), ("vad_parameters", '{"threshold": 0.4}')]
        + [("timestamp_granularities[]", "segment")],
        b"RIFF",
    )
    fields = request.triton_fields()
    assert fields["audio_file"] == b"RIFF" and fields["task"] == "transcribe"
    assert fields["language"] == "de" and fields["prompt"] == "Vorher"
    assert fields["timestamps"] is True and "stream" not in fields
    assert json.loads(fields["sampling_parameters"]) == {
        "beam_size": 5,
        "suppress_tokens": "-1,1234",
        "vad_parameters": {"threshold": 0.4},
    }


def test_every_whisper_language_passes_through_by_code_or_name():
    for language in ("cantonese", "yue", "Javanese", "haw"):
        request = audio.parse_form("transcribe", form(language=language), b"RIFF")
        assert request.triton_fields()["language"] == language  # whisper_lora resolves it
    for code, name in (("yue", "cantonese"), ("jw", "javanese"), ("haw", "hawaiian")):
        outputs = {"text_output": "", "language": code, "segments": "[]"}
        request = audio.SpeechRequest(
            "transcribe", "whisper_lora", b"x", response_format="verbose_json"
        )
        assert audio.render(request, outputs)[1]["language"] == name


@pytest.mark.parametrize(
    ("temperature", "sent"), [(None, None), ("0", None), ("0.0", None), ("0.4", 0.4)]
)
def test_temperature_zero_is_the_fallback_schedule(temperature, sent):
    fields = form() if temperature is None else form(temperature=temperature)
    request = audio.parse_form("translate", fields, b"x")
    sampling = json.loads(request.triton_fields().get("sampling_parameters", "{}"))
    assert sampling.get("temperature") == sent
    assert request.triton_fields()["task"] == "translate"


@pytest.mark.parametrize(
    ("fields", "audio_bytes", "message", "param"),
    [
        (form(), None, "'file' is required", "file"),
        (form(), b"", "'file' is empty", "file"),
        ([("language", "en")], b"x", "'model' is required", "model"),
        (form(response_format="xml"), b"x", "response_format must be one of", "response_format"),
        (
            form(response_format="verbose_json") + [("timestamp_granularities[]", "char")],
            b"x",
            "'char' is not supported (segment or word)",
            "timestamp_granularities",
        ),
        (
            form() + [("timestamp_granularities[]", "word")],
            b"x",
            "needs response_format verbose_json",
            "timestamp_granularities",
        ),
        (form(max_line_width="20"), b"x", "use response_format srt or vtt", "max_line_width"),
        (
            form(response_format="verbose_json", highlight_words="true"),
            b"x",
            "use response_format srt or vtt",
            "highlight_words",
        ),
        (form(response_format="srt", max_line_width="0"), b"x", "from 1 to", "max_line_width"),
        (form(response_format="vtt", max_line_count="-1"), b"x", "from 1 to", "max_line_count"),
        (form(response_format="srt", max_line_count="2.5"), b"x", "got '2.5'", "max_line_count"),
        (form(response_format="srt", max_line_count="²"), b"x", "from 1 to", "max_line_count"),
        (
            form(response_format="srt", max_words_per_line="9" * 5000),
            b"x",
            "from 1 to 10000",
            "max_words_per_line",
        ),
        (
            form(response_format="vtt", highlight_words="yes"),
            b"x",
            "'highlight_words' must be true or false",
            "highlight_words",
        ),
        (
            form() + [("timestamp_granularities[]", "segment")],
            b"x",
            "needs response_format verbose_json",
            "timestamp_granularities",
        ),
        (form(temperature="hot"), b"x", "temperature must be a number", "temperature"),
        (form(temperature="1.5"), b"x", "temperature must be in [0, 1]", "temperature"),
        (form(stream="maybe"), b"x", "'stream' must be true or false", "stream"),
        (form(stream="true", response_format="srt"), b"x", "use response_format json", "stream"),
        (form() + [("include[]", "logprobs")], b"x", "not supported", "include"),
    ],
)
def test_transcription_form_errors(fields, audio_bytes, message, param):
    with pytest.raises(OpenAIError) as caught:
        audio.parse_form("transcribe", fields, audio_bytes)
    assert caught.value.status == 400 and message in caught.value.message
    assert caught.value.param == param


def test_srt_and_vtt():
    assert audio.to_srt(SEGMENTS) == (
        "1\n00:00:00,000 --> 00:00:02,500\nThe quick brown fox.\n\n"
        "2\n00:00:02,500 --> 01:01:01,250\nA -> B\n\n"
    )
    assert audio.to_vtt(SEGMENTS) == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nThe quick brown fox.\n\n"
        "00:00:02.500 --> 01:01:01.250\nA -> B\n\n"
    )


def test_response_formats():
    outputs = {"text_output": "Hallo.", "language": "de", "segments": json.dumps(SEGMENTS)}

    def rendered(fmt):
        request = audio.SpeechRequest("transcribe", "whisper_lora", b"x", response_format=fmt)
        return audio.render(request, outputs)

    assert rendered("json") == ("application/json", {"text": "Hallo."})
    assert rendered("text") == ("text/plain", "Hallo.\n")
    assert rendered("srt")[0] == "application/x-subrip"
    assert rendered("vtt")[1].startswith("WEBVTT")
    media, body = rendered("verbose_json")
    assert body["task"] == "transcribe" and body["language"] == "german"
    assert body["duration"] == 3661.25  # b"x" is no audio file: the last segment's end
    first = body["segments"][0]
    assert set(first) == {
        "id", "seek", "start", "end", "text", "tokens", "temperature", "avg_logprob",
        "compression_ratio", "no_speech_prob",
    }  # fmt: skip
    assert (first["id"], first["start"], first["avg_logprob"], first["tokens"]) == (
        0,
        0.0,
        -0.2,
        [],
    )
    assert body["segments"][1]["temperature"] == 0.2


WORD_SEGMENTS = [
    {
        "start": 0.0,
        "end": 0.9,
        "text": " Hi there.",
        "words": [
            {"word": " Hi", "start": 0.0, "end": 0.3, "probability": 0.9},
            {"word": " there.", "start": 0.4, "end": 0.9, "probability": 0.8},
        ],
    },
    {
        "start": 2.0,
        "end": 2.5,
        "text": " Bye.",
        "words": [{"word": " Bye.", "start": 2.0, "end": 2.5, "probability": 0.7}],
    },
]
WORDS = [
    {"word": "Hi", "start": 0.0, "end": 0.3},
    {"word": "there.", "start": 0.4, "end": 0.9},
    {"word": "Bye.", "start": 2.0, "end": 2.5},
]


@pytest.mark.parametrize(
    ("granularities", "keys"),
    [
        ([], {"segments"}),
        (["segment"], {"segments"}),
        (["word"], {"words"}),
        (["word", "segment"], {"words", "segments"}),
        (["segment", "word", "word"], {"words", "segments"}),
    ],
)
def test_word_granularity(granularities, keys):
    fields = form(response_format="verbose_json") + [
        ("timestamp_granularities[]", g) for g in granularities
    ]
    request = audio.parse_form("transcribe", fields, b"x")
    sent = json.loads(request.triton_fields().get("sampling_parameters", "{}"))
    assert sent.get("word_timestamps", False) is ("word" in granularities)
    assert request.triton_fields()["timestamps"] is True
    outputs = {"text_output": " Hi there. Bye.", "segments": json.dumps(WORD_SEGMENTS)}
    body = audio.render(request, outputs)[1]
    assert {"words", "segments"} & set(body) == keys
    if "words" in keys:
        assert body["words"] == WORDS  # OpenAI's shape: no leading space, no probability
    if "segments" in keys:
        assert [s["text"] for s in body["segments"]] == [" Hi there.", " Bye."]
        assert "words" not in body["segments"][0]


def test_writer_options_ask_for_word_timings_and_lay_out_cues():
    request = audio.parse_form(
        "transcribe",
        form(response_format="srt", max_line_width="8", max_line_count="1", beam_size="2"),
        b"x",
    )
    assert json.loads(request.triton_fields()["sampling_parameters"]) == {
        "beam_size": 2,
        "word_timestamps": True,
    }
    outputs = {"text_output": "", "segments": json.dumps(WORD_SEGMENTS)}
    assert audio.render(request, outputs)[1] == (
        "1\n00:00:00,000 --> 00:00:00,300\nHi\n\n"
        "2\n00:00:00,400 --> 00:00:00,900\nthere.\n\n"
        "3\n00:00:02,000 --> 00:00:02,500\nBye.\n\n"
    )
    highlight = audio.parse_form(
        "transcribe", form(response_format="vtt", highlight_words="1"), b"x"
    )
    body = audio.render(highlight, outputs)[1]
    assert body.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:00.300\n<u>Hi</u> there.\n\n")
    # Segment cues stay as they were when no word timings are asked for.
    plain = audio.parse_form("transcribe", form(response_format="srt"), b"x")
    assert "sampling_parameters" not in plain.triton_fields()


def test_transcript_event_shapes():
    assert audio.delta_event(" The") == {"type": "transcript.text.delta", "delta": " The"}
    assert audio.done_event("The end.") == {"type": "transcript.text.done", "text": "The end."}


# ---- chat ----------------------------------------------------------------------------------------
PNG_URL = "data:image/png;base64,iVBORw0KGgo="


def image(url=PNG_URL):
    return {"type": "image_url", "image_url": {"url": url}}


def test_one_user_turn_uses_the_models_own_template():
    prompt = chat.build_prompt(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [image(), {"type": "text", "text": "What is it?"}]},
        ]
    )
    assert prompt == chat.Prompt("What is it?", [PNG_URL], "Be brief.", templated=False)
    fields = chat.triton_fields(prompt, [b"png"], {"max_tokens": 8}, stream=True)
    assert fields["text_input"] == "What is it?" and fields["image"] == [b"png"]
    assert fields["system_prompt"] == "Be brief." and fields["stream"] is True
    assert fields["exclude_input_in_output"] is True and "apply_chat_template" not in fields
    assert all(fields[name] is True for name in chat.ADDITIONAL_OUTPUTS)


@pytest.mark.parametrize(
    "messages",
    [
        [  # several turns
            {"role": "user", "content": [image(), {"type": "text", "text": "Colour?"}]},
            {"role": "assistant", "content": "Red."},
            {"role": "user", "content": "And the shape?"},
        ],
        [  # text before the image
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Look:"}, image()]},
        ],
    ],
    ids=["multi-turn", "text-first"],
)
def test_other_conversations_render_the_qwen2_vl_template(messages):
    prompt = chat.build_prompt(messages)
    assert prompt.templated and prompt.image_urls == [PNG_URL]
    template = (DEMO / "qwen2-vl-tiny" / "chat_template.jinja").read_text()
    as_template = [
        {**m, "role": "system" if m["role"] == "developer" else m["role"]} for m in messages
    ]
    expected = (
        jinja2.Environment()
        .from_string(template)
        .render(messages=as_template, add_generation_prompt=True)
    )
    assert prompt.text == expected
    assert chat.triton_fields(prompt, [b"png"], {}, stream=False)["apply_chat_template"] is False


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "messages must not be empty"),
        ([{"role": "tool", "content": "x"}], "role 'tool' is not supported"),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], "'input_audio' is not"),
        ([{"role": "assistant", "content": "x"}], "the last message must be the user's"),
        (
            [{"role": "system", "content": [image()]}, {"role": "user", "content": "x"}],
            "a system message can carry text only",
        ),
    ],
)
def test_message_errors(messages, message):
    with pytest.raises(OpenAIError, match=message):
        chat.build_prompt(messages)


def test_image_urls():
    assert chat.decode_image_url("data:image/png;base64,aGVsbG8=", 0, 100) == b"hello"
    assert chat.decode_image_url("aGVsbG8=", 0, 100) == b"hello"
    with pytest.raises(OpenAIError, match="must be base64"):
        chat.decode_image_url("data:image/png,hello", 0, 100)
    with pytest.raises(OpenAIError, match="not a data URL or base64"):
        chat.decode_image_url("file:///etc/passwd", 0, 100)
    with pytest.raises(OpenAIError) as caught:
        chat.decode_image_url("aGVsbG8=" * 100, 0, 100)
    assert caught.value.status == 413


def test_sampling_fields_and_structured_outputs():
    schema = {"type": "object", "properties": {"color": {"type": "string"}}}
    request = chat.parse_request(
        {
            "model": "qwen_vl_lora",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 99,
            "max_completion_tokens": 8,
            "temperature": 0.5,
            "seed": 3,
            "stop": ["\n"],
            "n": 1,
            "top_k": 4,
            "ignore_eos": True,
            "repetition_penalty": 1.1,
            "user": "ignored",
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "c", "schema": schema},
            },
        }
    )
    assert chat.sampling_parameters(request) == {
        "max_tokens": 8,
        "temperature": 0.5,
        "seed": 3,
        "stop": ["\n"],
        "top_k": 4,
        "ignore_eos": True,
        "repetition_penalty": 1.1,
        "structured_outputs": {"json": schema},
    }
    json_object = {"model": "m", "messages": [], "response_format": {"type": "json_object"}}
    assert chat.sampling_parameters(chat.parse_request(json_object)) == {
        "structured_outputs": {"json_object": True}
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"n": 2}, "n > 1 is not supported"),
        ({"logprobs": True}, "logprobs are not supported"),
        ({"response_format": {"type": "json_schema"}}, "needs json_schema.schema"),
        ({"response_format": {"type": "yaml"}}, "'yaml' is not supported"),
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "not both",
        ),
        ({"max_tokens": "many"}, "max_tokens"),
    ],
)
def test_sampling_errors(body, message):
    with pytest.raises(OpenAIError, match=message) as caught:
        chat.sampling_parameters(chat.parse_request({"model": "m", "messages": [], **body}))
    assert caught.value.status == 400


def test_completion_and_chunks():
    outputs = {
        "text_output": "Red.",
        "finish_reason": "length",
        "num_input_tokens": 20,
        "num_output_tokens": 3,
    }
    body = chat.completion("qwen_vl_lora/alpha", outputs)
    assert body["object"] == "chat.completion" and body["model"] == "qwen_vl_lora/alpha"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Red."}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23}

    stream = chat.ChunkStream("qwen_vl_lora", include_usage=True)
    first = stream.first()
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["usage"] is None and first["object"] == "chat.completion.chunk"
    part = {"text_output": "Re", "finish_reason": "None", "num_input_tokens": 20}
    chunks = stream.reply({**part, "num_output_tokens": 1})
    assert [c["choices"][0]["delta"] for c in chunks] == [{"content": "Re"}]
    chunks = stream.reply(
        {**part, "text_output": "d.", "finish_reason": "stop", "num_output_tokens": 2}
    )
    assert [(c["choices"][0]["delta"], c["choices"][0]["finish_reason"]) for c in chunks] == [
        ({"content": "d."}, None),
        ({}, "stop"),
    ]
    last = stream.usage_chunk()
    assert last["choices"] == [] and last["usage"]["total_tokens"] == 23
    assert {c["id"] for c in (first, *chunks, last)} == {stream.id}


# ---- errors and ids ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("message", "status"),
    [
        ("unknown adapter 'gamma'; available: alpha, beta", 404),
        ("image[0] is 70000000 bytes, over the 67108864 byte limit", 413),
        ("input 'audio_file' holds 70000000 bytes; at most 67108864 allowed", 413),
        ("Request for unknown model: 'x' is not found", 404),
        ("Request for unknown model: 'whisper_lora' has no available versions", 404),
        ("adapter 'a' cannot be served: its checked snapshot ... was changed", 503),
        ("request exceeded its 600 s timeout and was stopped", 503),
        ("engine unavailable: EngineCore died", 503),
        ("sampling_parameters: 'top_p' must be a number in (0, 1], got 2", 400),
        ("internal error: RuntimeError('x')", 500),
    ],
)
def test_triton_messages_map_to_http_status(message, status):
    err = from_triton(message)
    assert err.status == status
    body = err.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    # Triton's list of every adapter is cut whoever asks (the front names the caller's own ids)
    assert body["message"] == message.split("; available:")[0]


def test_listing_without_adapter_control_leaves_adapter_names_to_triton():
    from lora_openai.models import Listing

    listing = Listing({"whisper_lora": None, "qwen_vl_lora": ["alpha"]}, 0.0)
    assert listing.ids() == ["whisper_lora", "qwen_vl_lora", "qwen_vl_lora/alpha"]
    assert listing.serves(parse_model_id("whisper_lora/anything"))
    assert not listing.serves(parse_model_id("qwen_vl_lora/beta"))


def test_model_ids():
    assert parse_model_id("whisper_lora").parameters is None
    parsed = parse_model_id("qwen_vl_lora/alpha")
    assert (parsed.triton_model, parsed.adapter, parsed.id) == ("qwen_vl_lora", "alpha", parsed.id)
    assert parsed.parameters == {"lora_name": "alpha"}
    with pytest.raises(OpenAIError, match="names no adapter"):
        parse_model_id("qwen_vl_lora/")


# ---- the app with a fake gateway -----------------------------------------------------------------
class FakeGateway:
    """Answers like Triton would; records what was sent."""

    def __init__(self, url):
        self.sent = []
        self.adapters = {"whisper_lora": ["alpha"], "qwen_vl_lora": ["alpha", "beta"]}

    async def close(self):
        pass

    async def server_ready(self):
        return True

    async def model_ready(self, model):
        return True

    async def adapter_names(self, model):
        return self.adapters[model]

    async def stream(self, model, fields, parameters=None):
        self.sent.append((model, fields, parameters))
        if model == "whisper_lora":
            if fields.get("stream"):
                yield Reply({"text_output": " Hello"}, False)
                yield Reply({"text_output": " world."}, False)
            yield Reply({"text_output": " Hello world.", "language": "en", "segments": "[]"}, True)
            return
        if "bad" in fields["text_input"]:
            raise from_triton("sampling_parameters: 'top_k' must be an integer >= 0, got -5")
        common = {"num_input_tokens": 12, "finish_reason": "None"}
        yield Reply({**common, "text_output": "Re", "num_output_tokens": 1}, False)
        yield Reply(
            {**common, "text_output": "d", "finish_reason": "stop", "num_output_tokens": 1}, True
        )


@pytest.fixture
def client_and_gateway():
    gateways = []

    def factory(url):
        gateways.append(FakeGateway(url))
        return gateways[-1]

    app = BodySizeLimit(create_app(FrontSettings(), factory), max_bytes=4096)
    with TestClient(app) as client:
        yield client, gateways[0]


def test_endpoint_sources_are_read_before_the_first_request():
    """FastAPI reads an endpoint's source file on its first request, on the event loop (seconds
    on a busy machine, every other request waiting): the front reads them all at start."""
    import fastapi.routing

    app = create_app(FrontSettings(), FakeGateway)
    calls = [r.dependant.call for r in app.routes if isinstance(r, fastapi.routing.APIRoute)]
    assert len(calls) >= 5
    cache = fastapi.routing._endpoint_context_cache
    for call in calls:  # ids of earlier tests' endpoints, collected since, may be reused
        cache.pop(id(call), None)
    with TestClient(app):
        assert all(cache[id(call)].get("file", "").startswith(str(FRONT)) for call in calls)


def events(response) -> list:
    return [
        line[len("data: ") :] for line in response.text.split("\n") if line.startswith("data: ")
    ]


def test_models_listing(client_and_gateway):
    client, gateway = client_and_gateway
    ids = [item["id"] for item in client.get("/v1/models").json()["data"]]
    assert ids == [
        "whisper_lora", "whisper_lora/alpha", "qwen_vl_lora", "qwen_vl_lora/alpha",
        "qwen_vl_lora/beta",
    ]  # fmt: skip
    assert client.get("/v1/models/qwen_vl_lora/beta").json()["parent"] == "qwen_vl_lora"


def test_unknown_model_and_wrong_endpoint(client_and_gateway):
    client, _ = client_and_gateway
    files = {"file": ("a.wav", b"RIFF", "audio/wav")}
    response = client.post(
        "/v1/audio/transcriptions", data={"model": "whisper_lora/x"}, files=files
    )
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "whisper_lora/alpha" in error["message"]
    response = client.post("/v1/audio/transcriptions", data={"model": "qwen_vl_lora"}, files=files)
    assert response.status_code == 400
    assert client.get("/v1/nothing").json()["error"]["message"] == "Not Found"


def test_transcription_json_and_stream(client_and_gateway):
    client, gateway = client_and_gateway
    files = {"file": ("a.wav", b"RIFF", "audio/wav")}
    data = {"model": "whisper_lora/alpha", "beam_size": "2"}
    assert client.post("/v1/audio/transcriptions", data=data, files=files).json() == {
        "text": " Hello world."
    }
    model, fields, parameters = gateway.sent[-1]
    assert (model, parameters) == ("whisper_lora", {"lora_name": "alpha"})
    assert json.loads(fields["sampling_parameters"]) == {"beam_size": 2}
    response = client.post("/v1/audio/transcriptions", data={**data, "stream": "true"}, files=files)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert [json.loads(e) for e in events(response)] == [
        {"type": "transcript.text.delta", "delta": " Hello"},
        {"type": "transcript.text.delta", "delta": " world."},
        {"type": "transcript.text.done", "text": " Hello world."},
    ]


def test_chat_stream_with_usage_and_errors(client_and_gateway):
    client, gateway = client_and_gateway
    body = {
        "model": "qwen_vl_lora/beta",
        "messages": [{"role": "user", "content": [image(), {"type": "text", "text": "Hi"}]}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 4,
    }
    response = client.post("/v1/chat/completions", json=body)
    received = events(response)
    assert received[-1] == "[DONE]"
    chunks = [json.loads(e) for e in received[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == (
        "Red"
    )
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"] == {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}
    _, fields, parameters = gateway.sent[-1]
    assert fields["image"] == [b"\x89PNG\r\n\x1a\n"] and parameters == {"lora_name": "beta"}

    bad = {**body, "stream": False, "messages": [{"role": "user", "content": "bad"}]}
    response = client.post("/v1/chat/completions", json=bad)
    assert response.status_code == 400 and "top_k" in response.json()["error"]["message"]
    remote = {**bad, "messages": [{"role": "user", "content": [image("https://x.org/a.png")]}]}
    response = client.post("/v1/chat/completions", json=remote)
    assert (
        response.status_code == 400 and "--allow-image-urls" in response.json()["error"]["message"]
    )
    response = client.post("/v1/chat/completions", content=b"{not json")
    assert response.status_code == 400


def test_body_size_limit(client_and_gateway):
    client, _ = client_and_gateway
    files = {"file": ("a.wav", b"x" * 5000, "audio/wav")}
    response = client.post("/v1/audio/transcriptions", data={"model": "whisper_lora"}, files=files)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


# ---- lora-client --show --------------------------------------------------------------------------
def test_client_shows_a_chat_request_as_curl_and_openai_code(tmp_path):
    import base64
    import subprocess

    from lora_client import openai_examples as ex

    image_path = tmp_path / "a b.png"
    image_path.write_bytes(b"\x89PNG")
    body = {
        "model": ex.model_id("qwen_vl_lora", "beta"),
        "messages": ex.chat_messages('Say "$HOME" `x` \\n', [image_path], "Be brief."),
        "max_tokens": 8,
    }
    command = ex.chat_curl("http://h:9/v1", body, [image_path])
    sent = subprocess.run(
        ["bash", "-c", f'curl() {{ printf "%s" "$6"; }}; {command}'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    received = json.loads(sent)
    url = received["messages"][1]["content"][0]["image_url"]["url"]
    assert url == "data:image/png;base64," + base64.b64encode(b"\x89PNG").decode()
    assert received["messages"][1]["content"][1]["text"] == 'Say "$HOME" `x` \\n'
    assert received["model"] == "qwen_vl_lora/beta" and received["max_tokens"] == 8
    compile(ex.chat_python("http://h:9/v1", {**body, "stream": True}, [image_path]), "c", "exec")


def test_client_shows_a_transcription_as_curl_and_openai_code(tmp_path):
    import shlex

    from lora_client import openai_examples as ex

    request = ex.speech_request(
        tmp_path / "s.wav",
        "whisper_lora/alpha",
        task="translate",
        timestamps=True,
        decoding={"beam_size": 5, "vad_filter": True},
    )
    words = shlex.split(ex.speech_curl("http://h:9/v1", tmp_path / "s.wav", *request))
    assert words[2] == "http://h:9/v1/audio/translations"
    assert words[3:] == [
        "-F", f"file=@{tmp_path / 's.wav'}", "-F", "model=whisper_lora/alpha",
        "-F", "response_format=verbose_json", "-F", "timestamp_granularities[]=segment",
        "-F", "beam_size=5", "-F", "vad_filter=true",
    ]  # fmt: skip
    compile(ex.speech_python("http://h:9/v1", tmp_path / "s.wav", *request), "s", "exec")


def test_the_launcher_starts_and_stops_the_front_and_it_answers_503_without_triton():
    import socket
    import urllib.error
    import urllib.request

    from lora_serving.launcher import OpenAIFront

    ports = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    front = OpenAIFront(ports[0], ports[1])  # nothing listens on the "Triton" port
    try:
        front.wait_listening(timeout_s=60)
        for path in ("/health", "/v1/models"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(front.url + path, timeout=30)
            assert refused.value.code == 503
            error = json.loads(refused.value.read())["error"]
            assert error["type"] == "service_unavailable" and "is not ready" in error["message"]
    finally:
        front.stop()
    assert front.process.returncode is not None
