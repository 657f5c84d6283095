"""/v1/realtime's pure parts (local agreement, server_vad turns, event checks) and its two
protocols end to end in process, with test_openai_front's fake gateway (no server)."""

import asyncio
import base64
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from lora_openai.app import FrontSettings, create_app
from lora_openai.realtime import events
from lora_openai.realtime.agreement import LocalAgreement, continued
from lora_openai.realtime.events import OPENAI, VLLM, ProtocolError, SessionConfig
from lora_openai.realtime.turns import (
    FRAME_MS,
    ServerVad,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
)
from lora_openai.realtime.vad import FRAME_SAMPLES, StreamingVad, to_vad_rate
from tests.unit.test_openai_front import FakeGateway


# ---- local agreement ---------------------------------------------------------------------------
def test_only_words_two_hypotheses_agree_on_are_sent_and_never_retracted():
    agreement = LocalAgreement()
    assert agreement.update(" The quick") == ""  # nothing to agree with yet
    assert agreement.update(" The quick brown") == " The quick"  # "brown" is the newest word
    assert agreement.update(" The quack brown fox") == ""  # disagrees with what was sent
    assert agreement.update(" The quick brown fox jumps") == ""  # agrees only with a changed one
    assert agreement.update(" The quick brown fox jumps over") == " brown fox jumps"
    assert agreement.finish(" The quick brown fox jumps over the dog.") == " over the dog."
    assert agreement.sent == " The quick brown fox jumps over the dog."


def test_a_final_text_that_changed_a_sent_word_adds_nothing():
    agreement = LocalAgreement()
    agreement.update(" Hello there world")
    assert agreement.update(" Hello there world again") == " Hello there world"
    assert agreement.finish(" Hello, their world again.") == ""
    assert agreement.sent == " Hello there world"


def test_a_decode_continued_from_the_sent_text_is_joined_as_words():
    assert continued("the lazy dog.", "Please call Stella.") == "the lazy dog. Please call Stella."
    assert continued("Hello there", ", world.") == "Hello there, world."
    assert continued("Hello there ", "world") == "Hello there world"
    assert continued("Hello there", "  ") == "Hello there"
    assert continued("", "Hello") == "Hello"


def test_a_final_decode_that_changed_a_sent_word_is_decoded_again_after_the_sent_text():
    asyncio.run(_final_continues_the_sent_text())


async def _final_continues_the_sent_text():
    from lora_openai.realtime.session import LiveSession, RealtimeLimits

    sent, calls = [], []
    partials = iter(["Hello there world", "Hello there world again"])

    async def send(event):
        sent.append(event)

    async def transcribe(pcm, rate, config, final, *, prefix=None):
        calls.append((final, prefix))
        if prefix is not None:
            return "again, friends."  # what follows the sent text
        return "Hello, their world again, friends." if final else next(partials)

    limits = RealtimeLimits(partial_every_s=1.0, max_ahead_s=100)
    session = LiveSession(
        OPENAI, SessionConfig(rate=16000, turn_detection=None), send, transcribe, limits
    )
    for _ in range(2):
        await session.append(bytes(16000 * 2))  # one more second: a partial decode
        await asyncio.sleep(0.01)
    await session.commit()
    for _ in range(20):
        await asyncio.sleep(0.01)
    # the billed decode once, then the turn again continuing from what was sent (not billed)
    assert calls[-2:] == [(True, None), (False, "Hello there world")]
    deltas = [e["delta"] for e in sent if e["type"].endswith(".delta")]
    (completed,) = [e for e in sent if e["type"].endswith(".completed")]
    assert deltas[0] == "Hello there world"
    assert completed["transcript"] == "Hello there world again, friends."
    assert "".join(deltas) == completed["transcript"]  # nothing sent was taken back
    await session.close()


# ---- turn detection ----------------------------------------------------------------------------
SHORT = ServerVad(0.5, 96, 160)


def run_detector(probabilities, options=SHORT):
    detector = TurnDetector(options)
    return [(i, e) for i, p in enumerate(probabilities) if (e := detector.frame(p)) is not None]


def test_a_turn_ends_after_silence_duration_and_starts_with_its_prefix_padding():
    probabilities = [0.1] * 10 + [0.9] * 5 + [0.2] * 4 + [0.9] * 3 + [0.1] * 5 + [0.9] + [0.0] * 9
    found = run_detector(probabilities)
    # speech at frame 10 (320 ms) padded by 96 ms; a 4-frame pause (128 ms) does not end it;
    # 5 silent frames (160 ms) do: after frame 26, at 27 * 32 ms.
    assert found[0] == (10, SpeechStarted(320 - 96))
    assert found[1] == (26, SpeechStopped(27 * FRAME_MS))
    # the next turn's padding never reaches into the previous turn
    assert found[2] == (27, SpeechStarted(27 * FRAME_MS))
    assert found[3] == (32, SpeechStopped(33 * FRAME_MS))
    assert len(found) == 4


def test_silence_alone_makes_no_turn():
    assert run_detector([0.3] * 100) == []


# ---- events ------------------------------------------------------------------------------------
def pcm_b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<i2").tobytes()).decode()


def test_openai_session_update_is_checked_and_keeps_what_it_leaves_out():
    update = {
        "type": "session.update",
        "session": {
            "type": "transcription",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "transcription": {"model": "whisper_lora/alpha", "language": "en"},
                    "turn_detection": {"type": "server_vad", "silence_duration_ms": 700},
                }
            },
        },
    }
    event, _ = events.parse(json.dumps(update), OPENAI, SessionConfig())
    config = event.config
    assert config.transcription.model == "whisper_lora/alpha"
    assert config.turn_detection == ServerVad(0.5, 300, 700)
    shown = config.openai()["audio"]["input"]
    assert shown["turn_detection"]["silence_duration_ms"] == 700
    assert shown["format"] == {"type": "audio/pcm", "rate": 24000}
    off = {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}
    event, _ = events.parse(json.dumps(off), OPENAI, config)
    assert event.config.turn_detection is None
    assert event.config.transcription.model == "whisper_lora/alpha"


@pytest.mark.parametrize(
    ("message", "code", "param"),
    [
        ("not json", "invalid_json", None),
        ('{"type": "input_audio_buffer.append", "audio": "%%%"}', "invalid_audio", "audio"),
        ('{"type": "input_audio_buffer.append", "audio": "AAAA"}', "invalid_audio_format", "audio"),
        ('{"type": "response.create"}', "invalid_event_type", "type"),
        (
            '{"type": "session.update", "session": {"audio": {"input": {"format": '
            '{"type": "audio/pcmu"}}}}}',
            "invalid_value",
            "session.audio.input.format.type",
        ),
        (
            '{"type": "session.update", "session": {"audio": {"input": {"format": '
            '{"type": "audio/pcm", "rate": 8000}}}}}',
            "invalid_value",
            "session.audio.input.format.rate",
        ),
        (
            '{"type": "session.update", "session": {"audio": {"input": {"turn_detection": '
            '{"type": "server_vad", "threshold": 2}}}}}',
            "invalid_value",
            "session.audio.input.turn_detection.threshold",
        ),
    ],
)
def test_bad_client_events_are_protocol_errors(message, code, param):
    with pytest.raises(ProtocolError) as raised:
        events.parse(message, OPENAI, SessionConfig())
    assert (raised.value.code, raised.value.param) == (code, param)


def test_vllm_events():
    event, _ = events.parse(
        '{"type": "session.update", "model": "whisper_lora"}', VLLM, events.VLLM_SESSION
    )
    assert event.config.transcription.model == "whisper_lora" and event.config.rate == 16000
    event, _ = events.parse(
        '{"type": "input_audio_buffer.commit", "final": true}', VLLM, events.VLLM_SESSION
    )
    assert event == events.Commit(final=True)
    with pytest.raises(ProtocolError, match="unknown event type"):  # OpenAI's only
        events.parse('{"type": "input_audio_buffer.clear"}', VLLM, events.VLLM_SESSION)


# ---- Silero frame by frame ---------------------------------------------------------------------
def test_streaming_vad_hears_no_speech_in_silence_and_resamples_24k_frames():
    vad = StreamingVad()
    assert max(vad.probability(np.zeros(FRAME_SAMPLES, np.float32)) for _ in range(20)) < 0.1
    frame = to_vad_rate(np.full(768, 16384, dtype=np.int16))  # 32 ms at 24 kHz
    assert frame.shape == (FRAME_SAMPLES,) and np.allclose(frame, 0.5)


# ---- the WebSocket route, in process -----------------------------------------------------------
@pytest.fixture
def client():
    app = create_app(FrontSettings(), FakeGateway)
    with TestClient(app) as client:
        yield client


def test_vllm_protocol_transcribes_from_commit_to_final_commit(client):
    audio = pcm_b64(np.zeros(16000, np.int16))
    with client.websocket_connect("/v1/realtime") as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_json({"type": "input_audio_buffer.commit"})
        assert ws.receive_json()["code"] == "model_not_validated"
        ws.send_json({"type": "session.update", "model": "whisper_lora/nope"})
        assert ws.receive_json()["code"] == "model_not_found"
        ws.send_json({"type": "session.update", "model": "whisper_lora/alpha"})
        ws.send_json({"type": "input_audio_buffer.commit"})
        ws.send_json({"type": "input_audio_buffer.append", "audio": audio})
        ws.send_json({"type": "input_audio_buffer.commit", "final": True})
        replies = []
        while not replies or replies[-1]["type"] != "transcription.done":
            replies.append(ws.receive_json())
    assert "".join(r["delta"] for r in replies if r["type"] == "transcription.delta") == (
        " Hello world."
    )
    assert replies[-1]["text"] == " Hello world."


def test_openai_transcription_session_with_manual_commits(client):
    audio = pcm_b64(np.zeros(4800, np.int16))  # 200 ms at 24 kHz
    with client.websocket_connect("/v1/realtime?intent=transcription") as ws:
        created = ws.receive_json()
        assert created["type"] == "session.created"
        assert created["session"]["audio"]["input"]["format"]["rate"] == 24000
        ws.send_json({"type": "conversation.item.create", "event_id": "e1"})
        error = ws.receive_json()
        assert error["type"] == "error" and error["error"]["event_id"] == "e1"
        assert error["error"]["code"] == "invalid_event_type"
        update = {
            "type": "session.update",
            "session": {
                "type": "transcription",
                "audio": {
                    "input": {
                        "transcription": {"model": "whisper_lora/alpha"},
                        "turn_detection": None,
                    }
                },
            },
        }
        ws.send_json(update)
        updated = ws.receive_json()
        assert updated["type"] == "session.updated"
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        ws.send_json({"type": "input_audio_buffer.append", "audio": audio})
        ws.send_json({"type": "input_audio_buffer.commit"})
        committed = ws.receive_json()
        assert committed["type"] == "input_audio_buffer.committed"
        delta = ws.receive_json()
        completed = ws.receive_json()
    assert delta["type"] == "conversation.item.input_audio_transcription.delta"
    assert completed["type"] == "conversation.item.input_audio_transcription.completed"
    assert completed["item_id"] == committed["item_id"] == delta["item_id"]
    assert delta["delta"] == completed["transcript"] == " Hello world."
    assert completed["usage"] == {"type": "duration", "seconds": 0.2}


def test_the_handshake_needs_a_key_when_keys_are_configured():
    from starlette.testclient import WebSocketDenialResponse

    from lora_openai.auth import ApiKeyAuth, Tenancy

    tenancy = Tenancy(api_key="secret")
    app = ApiKeyAuth(create_app(FrontSettings(), FakeGateway, tenancy=tenancy), tenancy)
    with TestClient(app) as client:
        with pytest.raises(WebSocketDenialResponse) as refused:
            with client.websocket_connect("/v1/realtime", headers={"Authorization": "Bearer no"}):
                pass
        assert refused.value.status_code == 401
        assert refused.value.json()["error"]["code"] == "invalid_api_key"
        headers = {"Authorization": "Bearer secret"}
        with client.websocket_connect("/v1/realtime", headers=headers) as ws:
            assert ws.receive_json()["type"] == "session.created"


def test_a_new_rate_keeps_the_session_time_and_limits_end_the_session():
    asyncio.run(_new_rate_and_limits())


async def _new_rate_and_limits():
    from lora_openai.realtime.session import LiveSession, RealtimeLimits, SessionOver

    sent = []

    async def send(event):
        sent.append(event)

    async def transcribe(pcm, rate, config, final):
        return " text"

    limits = RealtimeLimits(max_session_s=3, max_ahead_s=100)
    session = LiveSession(OPENAI, SessionConfig(turn_detection=None), send, transcribe, limits)
    await session.append(bytes(24000 * 2))  # 1 s at 24 kHz
    session.reconfigure(SessionConfig(rate=16000, turn_detection=None))
    assert session._position_ms == 1000
    await session.append(bytes(16000 * 2))
    with pytest.raises(SessionOver, match="realtime_max_session_s"):
        await session.append(bytes(16000 * 2 + 2))
    await session.close()


def test_an_idle_session_gets_an_error_naming_the_limit_and_is_closed():
    from starlette.websockets import WebSocketDisconnect

    app = create_app(FrontSettings(realtime_idle_timeout_s=0.2), FakeGateway)
    with TestClient(app) as client, client.websocket_connect("/v1/realtime") as ws:
        assert ws.receive_json()["type"] == "session.created"
        error = ws.receive_json()
        assert error["code"] == "idle_timeout" and "realtime_idle_timeout_s" in error["error"]
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1008


def test_a_long_turn_is_ended_at_the_limit_and_a_fast_client_waits():
    asyncio.run(_long_turn_and_pacing())


async def _long_turn_and_pacing():
    import time

    from lora_openai.realtime.session import LiveSession, RealtimeLimits

    sent = []

    async def send(event):
        sent.append(event)

    async def transcribe(pcm, rate, config, final):
        return " text"

    limits = RealtimeLimits(max_turn_s=1.0, max_ahead_s=0.5, partial_every_s=100)
    config = SessionConfig(rate=16000, turn_detection=None)
    session = LiveSession(OPENAI, config, send, transcribe, limits)
    began = time.monotonic()
    await session.append(bytes(16000 * 2 * 6 // 10))  # 0.6 s: 0.1 s ahead of the allowance
    await session.append(bytes(16000 * 2 * 6 // 10))  # 1.2 s: over the turn limit
    assert time.monotonic() - began >= 0.6  # waited until at most 0.5 s ahead of real time
    for _ in range(20):
        await asyncio.sleep(0.01)
    kinds = [event["type"] for event in sent]
    assert kinds[:2] == ["error", "input_audio_buffer.committed"], kinds
    assert sent[0]["error"]["code"] == "buffer_limit"
    assert "realtime_max_turn_s" in sent[0]["error"]["message"]
    assert kinds[-1] == "conversation.item.input_audio_transcription.completed"
    await session.close()


def test_partial_decodes_give_way_to_ended_turns_across_sessions():
    asyncio.run(_partials_give_way())


async def _partials_give_way():
    from lora_openai.realtime.session import DecodeBudget, LiveSession, RealtimeLimits

    calls, release = [], asyncio.Event()

    async def send(event):
        pass

    async def transcribe(pcm, rate, config, final):
        calls.append(("final" if final else "partial", len(pcm) // 2 // rate))
        if final:
            await release.wait()  # the ended turn stays in its decode until released
        return " text"

    budget = DecodeBudget(max_partials=1)
    limits = RealtimeLimits(partial_every_s=1.0, max_ahead_s=100)
    config = SessionConfig(rate=16000, turn_detection=None)
    a = LiveSession(OPENAI, config, send, transcribe, limits, budget)
    b = LiveSession(OPENAI, config, send, transcribe, limits, budget)
    second = bytes(16000 * 2)

    await a.append(second)  # a's turn reached 1 s: a partial starts
    await b.append(second)  # the budget's one partial is a's: b waits
    await asyncio.sleep(0.01)
    assert calls == [("partial", 1)] and budget.partials == 0  # a's partial is done

    await a.commit()  # a's turn ended: its final decode is in flight
    await asyncio.sleep(0.01)
    await b.append(second)  # b's turn at 2 s, due, but a's ended turn comes first
    await asyncio.sleep(0.01)
    assert calls == [("partial", 1), ("final", 1)] and a.final_pending

    release.set()
    await asyncio.sleep(0.01)
    assert not a.final_pending
    await b.append(bytes(16000 * 2 // 10))  # the next chunk: b's partial may start now
    await asyncio.sleep(0.01)
    assert calls[-1] == ("partial", 2)

    await a.close()
    await b.close()
    assert budget.sessions == set() and budget.partials == 0


def test_a_turn_is_uploaded_as_a_mono_pcm16_wav_at_its_rate():
    import io
    import wave

    from lora_openai.realtime.transcribe import wav_file

    with wave.open(io.BytesIO(wav_file(b"\x00\x01" * 240, 24000))) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24000, 1, 2)
        assert wav.readframes(240) == b"\x00\x01" * 240
