"""/v1/realtime on the real front and the shared tritonserver, driven by the `websockets`
library from the openai SDK's environment (tests/e2e/realtime_ws_client.py; never .venv).

A recording of three espeak-ng sentences separated by pauses is streamed at real-time pace in
40 ms chunks, in two concurrent sessions: OpenAI's transcription session with server VAD on an
adapter (24 kHz), vLLM's protocol on the base model (16 kHz). Each completed turn must equal the
file transcription (the openai SDK, /v1/audio/transcriptions) of exactly that turn's audio with
the same model id, and a turn's deltas must add up to its completed text.
"""

import json
import signal
import subprocess
import threading
import wave
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, load_16k, only_with_model
from tests.e2e.test_openai_api import (  # noqa: F401 (fixture)
    call,
    front,
    front_on,
    ok,
    sdk_runner,
)
from tests.e2e.test_reliability import series, wait_for

pytestmark = only_with_model("whisper_lora")
SDK = REPO / "scripts" / "openai_sdk.sh"
CLIENT = REPO / "tests" / "e2e" / "realtime_ws_client.py"
WHISPER = "whisper_lora"
ADAPTER = f"{WHISPER}/alpha"
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things.",
    "A rainbow is a division of white light into many beautiful colors.",
)
PAUSE_S, LEAD_S, TAIL_S = 1.2, 0.5, 1.5
COMPLETED = "conversation.item.input_audio_transcription.completed"
DELTA = "conversation.item.input_audio_transcription.delta"


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def to_rate(samples: np.ndarray, rate: int) -> np.ndarray:
    positions = np.arange(int(len(samples) * rate / 16000)) * 16000 / rate
    return np.interp(positions, np.arange(len(samples)), samples).astype(np.float32)


def write_wav(path: Path, pcm: bytes, rate: int) -> str:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm)
    return str(path)


@pytest.fixture(scope="module")
def recording(speech, tmp_path_factory) -> dict[int, Path]:
    """The three sentences with pauses, as raw PCM16 at 16 and 24 kHz."""
    silence = lambda s: np.zeros(int(s * 16000), np.float32)  # noqa: E731
    parts = [silence(LEAD_S)]
    for sentence in SENTENCES:
        parts += [load_16k(speech(sentence)), silence(PAUSE_S)]
    parts.append(silence(TAIL_S - PAUSE_S))
    samples = np.concatenate(parts)
    folder = tmp_path_factory.mktemp("realtime")
    files = {}
    for rate in (16000, 24000):
        files[rate] = folder / f"recording_{rate}.pcm"
        files[rate].write_bytes(pcm16(samples if rate == 16000 else to_rate(samples, rate)))
    return files


@pytest.fixture(scope="module")
def sdk(request, front):  # noqa: F811
    return sdk_runner(request, front)


def live_runner(front_url: str):
    """run(*sessions) -> each session's result (tests/e2e/realtime_ws_client.py), at this front."""
    url = front_url.replace("http://", "ws://").removesuffix("/v1") + "/v1/realtime"

    def run(*sessions: dict) -> list[dict]:
        done = subprocess.run(
            ["bash", str(SDK), str(CLIENT)],
            input=json.dumps({"url": url, "sessions": list(sessions)}),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    return run


@pytest.fixture(scope="module")
def live(front):  # noqa: F811
    return live_runner(front)


@pytest.fixture(scope="module")
def strict_front(triton_server, tmp_path_factory):
    """A second lora-openai on the same tritonserver, with tiny realtime limits (it holds no
    model: it starts in about a second)."""
    limits = ["--realtime-max-session-s", "2", "--realtime-idle-timeout-s", "1.5"]
    with front_on(triton_server, tmp_path_factory.mktemp("strict"), options=limits) as server:
        yield f"{server.url}/v1"


def openai_update(model: str, rate: int = 24000, **input_fields) -> dict:
    audio_input = {
        "format": {"type": "audio/pcm", "rate": rate},
        "transcription": {"model": model, "language": "en"},
        "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
        **input_fields,
    }
    return {
        "type": "session.update",
        "session": {"type": "transcription", "audio": {"input": audio_input}},
    }


def of_type(events: list[dict], kind: str) -> list[dict]:
    return [event for event in events if event["type"] == kind]


def test_turns_equal_file_transcriptions_per_adapter_in_concurrent_sessions(
    live, sdk, recording, tmp_path
):
    adapter_session, base_session = live(
        {
            "query": "?intent=transcription",
            "steps": [
                {"send": openai_update(ADAPTER)},
                {"wait_for": "session.updated"},
                {"stream": str(recording[24000]), "rate": 24000, "chunk_ms": 40},
                {"send": {"type": "input_audio_buffer.clear"}},  # answered after the audio
                {"wait_for": "input_audio_buffer.cleared"},
                {"wait_until_completed": True},
            ],
        },
        {
            "steps": [
                {"send": {"type": "session.update", "model": WHISPER}},
                {"send": {"type": "input_audio_buffer.commit"}},
                {"stream": str(recording[16000]), "rate": 16000, "chunk_ms": 100},
                {"send": {"type": "input_audio_buffer.commit", "final": True}},
                {"wait_for": "transcription.done"},
            ],
        },
    )
    events = adapter_session["events"]
    assert not of_type(events, "error"), of_type(events, "error")
    started = of_type(events, "input_audio_buffer.speech_started")
    stopped = of_type(events, "input_audio_buffer.speech_stopped")
    completed = of_type(events, COMPLETED)
    assert len(started) == len(stopped) == len(completed) == len(SENTENCES), [
        (e["type"], e.get("transcript")) for e in events
    ]
    # Each turn's own audio, cut where the events say it is, as a file at the session's rate.
    pcm = recording[24000].read_bytes()
    files = []
    for index, (start, stop) in enumerate(zip(started, stopped, strict=True)):
        assert start["item_id"] == stop["item_id"]
        cut = slice(start["audio_start_ms"] * 24 * 2, stop["audio_end_ms"] * 24 * 2)
        files.append(write_wav(tmp_path / f"turn{index}.wav", pcm[cut], 24000))
    whole = write_wav(tmp_path / "whole.wav", recording[16000].read_bytes(), 16000)
    references = sdk(
        *(call("transcribe", file=f, model=ADAPTER, language="en") for f in files),
        call("transcribe", file=whole, model=WHISPER),
    )
    *texts, whole_text = [ok(reference)["text"] for reference in references]
    for start, done, text, file in zip(started, completed, texts, files, strict=True):
        assert done["item_id"] == start["item_id"]
        deltas = [e["delta"] for e in of_type(events, DELTA) if e["item_id"] == done["item_id"]]
        assert "".join(deltas) == done["transcript"], (deltas, done)  # none taken back
        if done["transcript"] != text:
            assert_continued(
                sdk, deltas, done["transcript"], text, file=file, model=ADAPTER, language="en"
            )
        assert done["usage"]["type"] == "duration"
    # vLLM's protocol, base model: one transcription from the first commit to the final one.
    base_events = base_session["events"]
    assert base_events[0]["type"] == "session.created"
    assert not of_type(base_events, "error"), of_type(base_events, "error")
    (base_done,) = of_type(base_events, "transcription.done")
    # Partial deltas come when two re-decodes agree; on two busy cores there may be few.
    deltas = [e["delta"] for e in of_type(base_events, "transcription.delta")]
    assert "".join(deltas) == base_done["text"]
    if base_done["text"] != whole_text:
        assert_continued(sdk, deltas, base_done["text"], whole_text, file=whole, model=WHISPER)


def assert_continued(sdk, deltas, completed, free_text, **upload):
    """A turn whose whole decode changed a word already sent (two partials agreed on it): the
    server decoded it again continuing from the sent text, and the same upload with that text as
    Whisper's `prefix` gives what followed it."""
    sent = "".join(deltas[:-1])  # the last delta is the rest the final decode added
    assert sent and not free_text.startswith(sent), (deltas, completed, free_text)
    (reply,) = sdk(call("transcribe", **upload, extra_body={"prefix": sent}))
    joined = sent + ok(reply)["text"]
    assert completed.replace(" ", "") == joined.replace(" ", ""), (completed, sent, joined)


def test_bad_input_gets_error_events_and_the_session_goes_on(live, recording):
    odd = {"type": "input_audio_buffer.append", "audio": "AAAA"}  # 3 bytes: not PCM16
    (openai_session, vllm_session) = live(
        {
            "query": "?intent=transcription",
            "steps": [
                {"send": {"type": "input_audio_buffer.append", "audio": "not base64!"}},
                {"send": odd},
                {"send": {"type": "response.create", "event_id": "client-1"}},
                {"send": openai_update(f"{WHISPER}/no-such-adapter")},
                {"send": openai_update(ADAPTER, rate=8000)},
                {"send": openai_update(ADAPTER, turn_detection=None)},
                {"wait_for": "session.updated"},
            ],
        },
        {
            "steps": [
                {"send": {"type": "input_audio_buffer.commit"}},
                {"send": {"type": "session.update", "model": "qwen_vl_lora"}},
                {"wait_for": "error", "count": 2},
            ]
        },
    )
    errors = [e["error"] for e in of_type(openai_session["events"], "error")]
    assert [e["code"] for e in errors] == [
        "invalid_audio",
        "invalid_audio_format",
        "invalid_event_type",
        "model_not_found",
        "invalid_value",
    ]
    assert errors[2]["event_id"] == "client-1"
    assert errors[3]["message"].startswith(f"The model '{WHISPER}/no-such-adapter' does not exist")
    assert errors[4]["param"] == "session.audio.input.format.rate"
    (updated,) = of_type(openai_session["events"], "session.updated")
    assert updated["session"]["audio"]["input"]["transcription"]["model"] == ADAPTER
    assert openai_session["closed"] == 1000
    codes = [e["code"] for e in of_type(vllm_session["events"], "error")]
    assert codes == ["model_not_validated", "invalid_value"]


def test_a_client_gone_mid_turn_leaves_no_engine_work(live, recording, triton_server):
    labels = {"model": WHISPER, "adapter": "(base)"}
    cancelled_before = series(triton_server, "lora_requests_total", outcome="cancelled", **labels)
    (gone,) = live(
        {
            "steps": [
                {"send": {"type": "session.update", "model": WHISPER}},
                {"send": {"type": "input_audio_buffer.commit"}},
                {"stream": str(recording[16000]), "rate": 16000, "chunk_ms": 100, "seconds": 4},
                {"send": {"type": "input_audio_buffer.commit", "final": True}},
                {"sleep": 0.3},  # the final decode of 4+ s of audio is on the engine now
                {"close": True},
            ]
        }
    )
    assert not of_type(gone["events"], "transcription.done")
    wait_for(
        lambda: series(triton_server, "lora_requests_total", outcome="cancelled", **labels)
        > cancelled_before,
        15,
        "the turn's Triton request was not cancelled when the client left",
    )
    wait_for(
        lambda: series(triton_server, "lora_requests_running", **labels) == 0,
        10,
        "the engine still runs the decode of a closed session",
    )


def test_sessions_past_their_limits_get_an_error_naming_it_and_are_closed(
    strict_front, recording, triton_server
):
    """Over the audio a session may send, and silent past the idle timeout: an error event that
    names the limit, a close (1008) whose reason is its code, and no engine work left behind."""
    long, idle = live_runner(strict_front)(
        {
            "steps": [
                {"send": {"type": "session.update", "model": WHISPER}},
                {"send": {"type": "input_audio_buffer.commit"}},  # a turn is decoding meanwhile
                {"stream": str(recording[16000]), "rate": 16000, "chunk_ms": 100, "seconds": 4},
                {"wait_for": "error"},
            ]
        },
        {
            "query": "?intent=transcription",
            "steps": [{"send": openai_update(ADAPTER)}, {"sleep": 4}],
        },
    )
    (error,) = of_type(long["events"], "error")
    assert error["code"] == "session_limit"
    assert "over 2 s of audio (limit realtime_max_session_s)" in error["error"], error
    assert (long["closed"], long["reason"]) == (1008, "session_limit")
    (error,) = of_type(idle["events"], "error")
    assert error["error"]["code"] == "idle_timeout"
    assert "(limit realtime_idle_timeout_s)" in error["error"]["message"]
    assert error["t"] >= 1.5
    assert (idle["closed"], idle["reason"]) == (1008, "idle_timeout")
    labels = {"model": WHISPER, "adapter": "(base)"}
    wait_for(
        lambda: series(triton_server, "lora_requests_running", **labels) == 0,
        10,
        "the engine still runs a decode of the session closed at its limit",
    )


def test_lora_client_live_prints_each_turn(front, speech):  # noqa: F811
    done = subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "lora-client"),
            "live",
            str(speech(SENTENCES[0])),
            "--adapter",
            "alpha",
            "--speed",
            "3",
            "--openai-url",
            front,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    turns = [line for line in done.stdout.splitlines() if line.startswith("[turn ")]
    assert len(turns) == 1, done.stdout
    assert "quick brown fox" in turns[0].lower(), done.stdout


def test_lora_client_live_reads_a_microphone_pipe_until_ctrl_c(front, recording):  # noqa: F811
    """`arecord ... | lora-client live -`: raw PCM on standard input that never ends; the turn
    comes back while the pipe is still open, and Ctrl-C ends the client cleanly."""
    client = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "lora-client"), "live", "-", "--openai-url", front],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    watchdog = threading.Timer(90, client.kill)  # a turn that never comes fails, not hangs
    watchdog.start()
    try:
        # the lead, sentence one and a second of its pause: the turn ends inside it
        client.stdin.write(recording[24000].read_bytes()[: int(5.5 * 24000) * 2])
        client.stdin.flush()
        lines = []
        for line in iter(client.stdout.readline, b""):  # the pipe stays open meanwhile
            lines.append(line.decode())
            if line.startswith(b"[turn "):
                break
        assert lines and "quick brown fox" in lines[-1].lower(), lines
        client.send_signal(signal.SIGINT)
        assert client.wait(timeout=30) == 0, client.stderr.read().decode()
    finally:
        watchdog.cancel()
        client.kill()
        client.wait()


def test_the_openai_sdk_realtime_client_transcribes_a_committed_turn(sdk, recording, tmp_path):
    pcm = recording[24000].read_bytes()[: int(4.5 * 24000) * 2]  # the lead and sentence one
    part = tmp_path / "part.pcm"
    part.write_bytes(pcm)
    session = openai_update(ADAPTER, turn_detection=None)["session"]
    (received, reference) = sdk(
        call("realtime_transcribe", pcm=str(part), session=session),
        call(
            "transcribe",
            file=write_wav(tmp_path / "part.wav", pcm, 24000),
            model=ADAPTER,
            language="en",
        ),
    )
    kinds = [event["type"] for event in ok(received)]
    assert kinds[:2] == ["session.created", "session.updated"], kinds
    assert "input_audio_buffer.committed" in kinds, kinds
    assert ok(received)[-1]["type"] == COMPLETED, ok(received)[-1]
    assert ok(received)[-1]["transcript"] == ok(reference)["text"]
