"""The OpenAI-compatible front (lora-openai) on the shared tritonserver, driven by the official
openai SDK from its own environment (scripts/openai_sdk.sh; never .venv).

The front runs as its own process (`lora_serving.launcher.OpenAIFront`, as `make serve` starts
it) pointed at the suite's tritonserver. Each test sends its SDK calls in one run of
tests/e2e/openai_sdk_client.py (a JSON plan in, JSON results out) and compares answers with the
same request sent over gRPC with tritonclient: equal text, segments and token counts.
"""

import base64
import contextlib
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from lora_client.requests import transcription_fields

from tests.conftest import DEMO, REPO, only_with_model
from tests.e2e.test_adapter_fleet import (
    PREFIX,
    ROOT,
    clear_root,
    command,
    publish,
    retract,
    served,
)
from tests.e2e.test_reliability import series, wait_for
from tests.e2e.test_serving_stack import PROMPT, png, qwen_inputs
from tests.e2e.triton_calls import grpc_many, grpc_one, sampling

SDK = REPO / "scripts" / "openai_sdk.sh"
CLIENT = REPO / "tests" / "e2e" / "openai_sdk_client.py"
WHISPER, QWEN = "whisper_lora", "qwen_vl_lora"
SENTENCE = "The quick brown fox jumps over the lazy dog."
MAX_TOKENS = 16
LONG_TOKENS = 3000  # far more than the cancelled stream may generate
IMAGE_URL = "data:image/png;base64," + base64.b64encode(png()).decode()

whisper_only = only_with_model(WHISPER)
qwen_only = only_with_model(QWEN)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def front_on(triton_server, folder: Path, **options):
    """A lora-openai on the shared tritonserver (it holds no model: it starts in about a
    second), its log in `folder`; `options`: OpenAIFront's keyword arguments."""
    from lora_serving.launcher import OpenAIFront

    log_path = folder / "lora-openai.log"
    server = OpenAIFront(
        triton_server.grpc,
        _free_port(),
        triton_metrics=triton_server.metrics,
        log_path=log_path,
        **options,
    )
    try:
        server.wait_listening()
        yield server
    finally:
        server.stop()
        print(f"lora-openai log: {log_path}")


@pytest.fixture(scope="module")
def front(triton_server, tmp_path_factory):
    with front_on(triton_server, tmp_path_factory.mktemp("openai")) as server:
        yield f"{server.url}/v1"


def sdk_runner(request, base_url: str):
    """run(calls) -> results: the calls made with the openai SDK in its own environment."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        subprocess.run(["bash", str(SDK), "--install-only"], check=True, timeout=600)

    def run(*calls: dict) -> list:
        done = subprocess.run(
            ["bash", str(SDK), str(CLIENT)],
            input=json.dumps({"base_url": base_url, "calls": list(calls)}),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    return run


@pytest.fixture(scope="module")
def sdk(request, front):
    return sdk_runner(request, front)


def ok(result: dict):
    assert "ok" in result, result
    return result["ok"]


def call(op: str, **args) -> dict:
    return {"op": op, "args": args}


# ---- audio ---------------------------------------------------------------------------------------
@whisper_only
def test_transcription_equals_grpc_in_every_format_and_streamed(sdk, grpc_url, speech):
    wav = speech(SENTENCE)
    alpha = {"lora_name": "alpha"}
    triton_base, triton_alpha, triton_timed, triton_beam = grpc_many(  # Triton's, in one batch
        grpc_url,
        WHISPER,
        [
            (transcription_fields(wav), None),
            (transcription_fields(wav), alpha),
            (transcription_fields(wav, timestamps=True), alpha),
            (transcription_fields(wav, decoding={"beam_size": 2}), alpha),
        ],
    )
    base_ref, alpha_ref, beam_ref = triton_base.text, triton_alpha.text, triton_beam.text
    segments_ref = json.loads(triton_timed.outputs["segments"][0])
    adapter = f"{WHISPER}/alpha"
    base, plain, text, verbose, srt, vtt, streamed, beam = sdk(
        call("transcribe", file=str(wav), model=WHISPER),
        call("transcribe", file=str(wav), model=adapter),
        call("transcribe", file=str(wav), model=adapter, response_format="text"),
        call(
            "transcribe",
            file=str(wav),
            model=adapter,
            response_format="verbose_json",
            timestamp_granularities=["segment"],
        ),
        call("transcribe", file=str(wav), model=adapter, response_format="srt"),
        call("transcribe", file=str(wav), model=adapter, response_format="vtt"),
        call("transcribe", file=str(wav), model=adapter, stream=True),
        call("transcribe", file=str(wav), model=adapter, extra_body={"beam_size": 2}),
    )
    assert ok(base) == {"text": base_ref}
    assert ok(plain) == {"text": alpha_ref}
    assert ok(text) == alpha_ref + "\n"
    assert ok(beam) == {"text": beam_ref}

    verbose = ok(verbose)
    assert verbose["text"] == triton_timed.text and verbose["language"] == "english"
    assert verbose["task"] == "transcribe" and 2 < verbose["duration"] < 6
    assert [(s["start"], s["end"], s["text"]) for s in verbose["segments"]] == [
        (s["start"], s["end"], s["text"]) for s in segments_ref
    ]
    assert segments_ref and all("avg_logprob" in s for s in verbose["segments"])
    srt, vtt = ok(srt), ok(vtt)
    assert srt.startswith("1\n00:00:0") and srt.count(" --> ") == len(segments_ref)
    assert vtt.startswith("WEBVTT\n\n00:00:0") and vtt.count(" --> ") == len(segments_ref)
    for segment in segments_ref:
        assert segment["text"].strip() in srt and segment["text"].strip() in vtt

    events = ok(streamed)
    assert events[-1] == {"type": "transcript.text.done", "text": alpha_ref}
    deltas = events[:-1]
    assert deltas and {e["type"] for e in deltas} == {"transcript.text.delta"}
    assert "".join(e["delta"] for e in deltas) == alpha_ref


@whisper_only
def test_word_timestamps_through_the_sdk(sdk, grpc_url, speech):
    """timestamp_granularities=["word"] (alone and with "segment") gives OpenAI's top-level
    words, the served words of the same request over gRPC; srt takes openai-whisper's writer
    options (form fields) and lays the cues out from those words; a bad option is a 400 naming
    its field."""
    from lora_openai.subtitles import WriterOptions, to_srt

    wav = speech(SENTENCE)
    fields = transcription_fields(wav, timestamps=True, decoding={"word_timestamps": True})
    served = grpc_one(grpc_url, WHISPER, fields, {"lora_name": "alpha"})
    segments = json.loads(served.outputs["segments"][0])
    words = [
        {"word": w["word"].strip(), "start": w["start"], "end": w["end"]}
        for s in segments
        for w in s["words"]
    ]
    adapter = f"{WHISPER}/alpha"
    verbose = {"file": str(wav), "model": adapter, "response_format": "verbose_json"}
    only_words, both, srt, bad = sdk(
        call("transcribe", **verbose, timestamp_granularities=["word"]),
        call("transcribe", **verbose, timestamp_granularities=["word", "segment"]),
        call(
            "transcribe",
            file=str(wav),
            model=adapter,
            response_format="srt",
            extra_body={"max_line_width": 16, "max_line_count": 1, "highlight_words": True},
        ),
        call(
            "transcribe",
            file=str(wav),
            model=adapter,
            response_format="srt",
            extra_body={"max_line_width": 0},
        ),
    )
    assert len(words) >= 8 and words[0]["word"] == "The"
    only_words = ok(only_words)
    assert only_words["words"] == words and "segments" not in only_words
    assert only_words["text"] == served.text
    both = ok(both)
    assert both["words"] == words
    assert [(s["start"], s["end"], s["text"]) for s in both["segments"]] == [
        (s["start"], s["end"], s["text"]) for s in segments
    ]
    options = WriterOptions(max_line_width=16, max_line_count=1, highlight_words=True)
    assert ok(srt) == to_srt(segments, options) and "<u>The</u>" in ok(srt)
    assert bad["error"]["status"] == 400
    assert bad["error"]["body"]["error"]["param"] == "max_line_width"


@whisper_only
def test_translation_equals_grpc_for_base_and_adapter(sdk, grpc_url, speech):
    """espeak-ng's German is hard for whisper-base: a window can fail its checks and be
    sampled again at a higher temperature, so both paths send the same seed."""
    wav = speech("Guten Morgen. Wie geht es dir heute?", voice="de")
    fields = transcription_fields(wav, task="translate", decoding={"seed": 7})
    base_ref = grpc_one(grpc_url, WHISPER, fields).text
    alpha_ref = grpc_one(grpc_url, WHISPER, fields, {"lora_name": "alpha"}).text
    base, alpha = sdk(
        call("translate", file=str(wav), model=WHISPER, extra_body={"seed": 7}),
        call("translate", file=str(wav), model=f"{WHISPER}/alpha", extra_body={"seed": 7}),
    )
    assert ok(base) == {"text": base_ref} and ok(alpha) == {"text": alpha_ref}
    assert base_ref.strip()


@whisper_only
def test_every_container_transcribes_as_through_triton(sdk, grpc_url, speech, tmp_path):
    """m4a (AAC, and ALAC), webm (Opus) and mp4 (with a video track), encoded here with PyAV,
    give through the front the text Triton gives for the same file (lossless ALAC: the WAV's),
    for the base model and an adapter; verbose_json's duration is the container's."""
    import soundfile

    from tests.audio_files import encode

    wav = speech(SENTENCE)
    samples, rate = soundfile.read(wav, dtype="float32")
    files = {
        "m4a": encode(samples, rate, "ipod", "aac")[0],
        "webm": encode(samples, rate, "webm", "libopus", codec_rate=48000)[0],
        "mp4": encode(samples, rate, "mp4", "aac", video="mpeg4")[0],
        "alac.m4a": encode(samples, rate, "ipod", "alac")[0],
    }
    paths = {}
    for kind, data in files.items():
        paths[kind] = tmp_path / f"speech.{kind}"
        paths[kind].write_bytes(data)
    models = {WHISPER: None, f"{WHISPER}/alpha": {"lora_name": "alpha"}}
    runs = [(kind, model) for kind in paths for model in models]
    # Triton's answers, all at once (one batch: what each row gives does not depend on it).
    outcomes = grpc_many(
        grpc_url,
        WHISPER,
        [(transcription_fields(paths[kind]), models[model]) for kind, model in runs]
        + [(transcription_fields(wav), lora) for lora in models.values()],
    )
    refs = {run: outcome.text for run, outcome in zip(runs, outcomes[: len(runs)], strict=True)}
    wav_refs = {
        model: outcome.text for model, outcome in zip(models, outcomes[len(runs) :], strict=True)
    }
    results = sdk(
        *[call("transcribe", file=str(paths[kind]), model=model) for kind, model in runs],
        call("transcribe", file=str(paths["webm"]), model=WHISPER, response_format="verbose_json"),
    )
    for (kind, model), result in zip(runs, results, strict=False):
        assert ok(result) == {"text": refs[kind, model]}, (kind, model)
    for model in models:
        assert refs["alac.m4a", model] == wav_refs[model]
    verbose = ok(results[-1])
    assert verbose["text"] == refs["webm", WHISPER]
    assert abs(verbose["duration"] - len(samples) / rate) < 0.03


# ---- chat ----------------------------------------------------------------------------------------
def image_message(text: str = PROMPT) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": IMAGE_URL}},
                {"type": "text", "text": text},
            ],
        }
    ]


@qwen_only
def test_chat_with_an_image_equals_grpc_streamed_and_not(sdk, grpc_url):
    refs = {
        name: grpc_one(grpc_url, QWEN, qwen_inputs(), {"lora_name": name} if name else None)
        for name in (None, "alpha")
    }
    common = {"messages": image_message(), "max_tokens": MAX_TOKENS, "temperature": 0}
    base, alpha, streamed, multi_turn = sdk(
        call("chat", model=QWEN, **common),
        call("chat", model=f"{QWEN}/alpha", **common),
        call(
            "chat_stream",
            model=f"{QWEN}/alpha",
            stream_options={"include_usage": True},
            **common,
        ),
        call(
            "chat",
            model=f"{QWEN}/alpha",
            max_tokens=4,
            messages=[
                {"role": "system", "content": "Answer briefly."},
                *image_message(),
                {"role": "assistant", "content": "A red square."},
                {"role": "user", "content": "And its size?"},
            ],
        ),
    )
    for result, name in ((base, None), (alpha, "alpha")):
        ref = refs[name].outputs
        body = ok(result)
        assert body["model"] == (f"{QWEN}/alpha" if name else QWEN)
        choice = body["choices"][0]
        assert choice["message"]["content"] == ref["text_output"][0]
        assert choice["finish_reason"] == ref["finish_reason"][0]
        assert body["usage"]["prompt_tokens"] == ref["num_input_tokens"][0]
        assert body["usage"]["completion_tokens"] == ref["num_output_tokens"][0]

    chunks = ok(streamed)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == refs["alpha"].text
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finishes = [c["choices"][0].get("finish_reason") for c in chunks if c["choices"]]
    assert finishes[-1] == refs["alpha"].outputs["finish_reason"][0]
    assert (
        chunks[-1]["choices"] == []
        and chunks[-1]["usage"]["completion_tokens"]
        == (refs["alpha"].outputs["num_output_tokens"][0])
    )
    assert ok(multi_turn)["usage"]["completion_tokens"] > 0


@qwen_only
def test_json_schema_output_parses(sdk):
    """The random-weight demo model fills free JSON with whitespace (see the vllm_backend parity
    test), so the schema leaves no room for it."""
    schema = {"enum": ["small", "large", 7]}
    (result,) = sdk(
        call(
            "chat",
            model=f"{QWEN}/beta",
            messages=image_message("How big is it?"),
            max_tokens=40,
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        )
    )
    assert json.loads(ok(result)["choices"][0]["message"]["content"]) in schema["enum"]


# ---- models and errors ---------------------------------------------------------------------------
@qwen_only
def test_models_list_follows_the_adapter_fleet(sdk, grpc_url):
    name = f"{PREFIX}_openai"
    model_id = f"{QWEN}/{name}"
    try:
        (before,) = sdk(call("models"))
        assert {QWEN, f"{QWEN}/alpha", f"{QWEN}/beta"} <= set(ok(before))
        assert model_id not in ok(before)
        publish(DEMO / "qwen2-vl-adapters" / "alpha", name)
        command(grpc_url, "rescan")  # the periodic rescan (5 s) may have added it already
        assert name in served(grpc_url)
        time.sleep(1.5)  # past the front's listing cache
        added, answer = sdk(
            call("models"),
            call("chat", model=model_id, messages=image_message(), max_tokens=2),
        )
        assert model_id in ok(added)
        assert ok(answer)["model"] == model_id
        retract(name)
        command(grpc_url, "rescan")
        assert name not in served(grpc_url)
        time.sleep(1.5)
        removed, refused = sdk(
            call("models"),
            call("chat", model=model_id, messages=image_message(), max_tokens=2),
        )
        assert model_id not in ok(removed) and f"{QWEN}/alpha" in ok(removed)
        assert refused["error"]["status"] == 404
    finally:
        clear_root(ROOT)
        command(grpc_url, "rescan")


@qwen_only
def test_unknown_model_is_404_in_openai_shape(sdk, front, speech):
    chat_result, audio_result = sdk(
        call("chat", model=f"{QWEN}/nope", messages=image_message(), max_tokens=2),
        call("transcribe", file=str(speech("Hello.")), model="whisper-1"),
    )
    for result, model in ((chat_result, f"{QWEN}/nope"), (audio_result, "whisper-1")):
        assert result["error"]["status"] == 404
        error = result["error"]["body"]["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert f"'{model}' does not exist" in error["message"]
    request = urllib.request.Request(
        f"{front}/chat/completions", data=b'{"model": 1}', headers={"Content-Type": "x"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400
    assert json.loads(refused.value.read())["error"]["type"] == "invalid_request_error"


@qwen_only
def test_a_closed_stream_stops_its_engine_work(sdk, triton_server, grpc_url):
    labels = {"adapter": "beta"}
    cancelled_before = series(triton_server, "lora_requests_total", outcome="cancelled", **labels)
    tokens_before = series(triton_server, "lora_generation_tokens_total", **labels)
    (read,) = sdk(
        call(
            "cancel_stream",
            model=f"{QWEN}/beta",
            messages=[{"role": "user", "content": "Tell me a very long story."}],
            max_tokens=LONG_TOKENS,
            extra_body={"ignore_eos": True},
            chunks=5,
        )
    )
    assert ok(read) == 5
    wait_for(
        lambda: series(triton_server, "lora_requests_total", outcome="cancelled", **labels)
        == cancelled_before + 1,
        15,
        "the Triton request was not cancelled when the client closed its stream",
    )
    wait_for(
        lambda: series(triton_server, "lora_requests_running", **labels) == 0,
        10,
        "the engine still runs the cancelled request",
    )
    generated = series(triton_server, "lora_generation_tokens_total", **labels)
    time.sleep(2)
    assert series(triton_server, "lora_generation_tokens_total", **labels) == generated
    assert generated - tokens_before < LONG_TOKENS / 2, generated - tokens_before
    assert grpc_one(grpc_url, QWEN, qwen_inputs(sampling_parameters=sampling(max_tokens=2)),
                    {"lora_name": "beta"}).error is None  # fmt: skip
