"""The two realtime transcription protocols' events, checked (client) and built (server).

  vLLM's (`/v1/realtime`): session.update {model}; input_audio_buffer.append {audio: base64
  PCM16 16 kHz mono}; input_audio_buffer.commit {final}. Server: session.created,
  transcription.delta {delta}, transcription.done {text, usage}, error {error, code}.
  OpenAI's transcription session (`/v1/realtime?intent=transcription`): session.update
  {session: {type: "transcription", audio: {input: {format, transcription, turn_detection}}}};
  input_audio_buffer.append|commit|clear. Server events as the openai SDK's
  types/realtime models name them (session.created|updated, input_audio_buffer.speech_started|
  speech_stopped|committed|cleared, conversation.item.input_audio_transcription.delta|
  completed, error {error: {type, code, message, param, event_id}}).

Every problem is a `ProtocolError`: the session answers it with an error event and goes on.
"""

import base64
import binascii
import itertools
import json
from dataclasses import dataclass, field, replace

from lora_openai.realtime.turns import ServerVad

VLLM, OPENAI = "vllm", "openai"
PCM_RATES = (16000, 24000)  # OpenAI's audio/pcm is 24 kHz; 16 kHz (vLLM's) is also taken


class ProtocolError(Exception):
    def __init__(
        self,
        message: str,
        code: str | None,
        param: str | None = None,
        event_id=None,
        error_type: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.message, self.code, self.param, self.event_id = message, code, param, event_id
        self.error_type = error_type


# ---- client events -----------------------------------------------------------------------------
@dataclass(frozen=True)
class TranscriptionConfig:
    model: str | None = None
    language: str | None = None
    prompt: str | None = None


@dataclass(frozen=True)
class SessionConfig:
    """A session's settings; vLLM's protocol has only `model`, 16 kHz and no server VAD."""

    transcription: TranscriptionConfig = field(default_factory=TranscriptionConfig)
    rate: int = 24000
    turn_detection: ServerVad | None = field(default_factory=ServerVad)

    def openai(self) -> dict:
        """As OpenAI's RealtimeTranscriptionSessionCreateRequest."""
        vad = self.turn_detection
        return {
            "type": "transcription",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": self.rate},
                    "transcription": {
                        "model": self.transcription.model,
                        "language": self.transcription.language,
                        "prompt": self.transcription.prompt,
                    },
                    "turn_detection": None
                    if vad is None
                    else {
                        "type": "server_vad",
                        "threshold": vad.threshold,
                        "prefix_padding_ms": vad.prefix_padding_ms,
                        "silence_duration_ms": vad.silence_duration_ms,
                    },
                    "noise_reduction": None,
                }
            },
        }


VLLM_SESSION = SessionConfig(rate=16000, turn_detection=None)


@dataclass(frozen=True)
class Append:
    pcm: bytes  # PCM16 little-endian mono, whole samples


@dataclass(frozen=True)
class Commit:
    final: bool = False


@dataclass(frozen=True)
class Clear:
    pass


@dataclass(frozen=True)
class Update:
    config: SessionConfig


ClientEvent = Append | Commit | Clear | Update


def parse(text: str | bytes, protocol: str, current: SessionConfig) -> tuple[ClientEvent, object]:
    """One client message -> (event, its event_id)."""
    try:
        event = json.loads(text)
    except ValueError:
        raise ProtocolError("the message is not JSON", "invalid_json") from None
    if not isinstance(event, dict):
        raise ProtocolError("an event is a JSON object", "invalid_event")
    event_id = event.get("event_id")
    kind = event.get("type")
    try:
        if kind == "input_audio_buffer.append":
            return Append(_pcm(event.get("audio"))), event_id
        if kind == "input_audio_buffer.commit":
            return Commit(final=protocol == VLLM and event.get("final") is True), event_id
        if kind == "input_audio_buffer.clear" and protocol == OPENAI:
            return Clear(), event_id
        if kind == "session.update":
            if protocol == VLLM:
                model = event.get("model")
                if not isinstance(model, str) or not model:
                    raise ProtocolError("session.update needs a 'model'", "invalid_value", "model")
                return Update(replace(current, transcription=TranscriptionConfig(model))), event_id
            return Update(_openai_session(event.get("session"), current)), event_id
    except ProtocolError as err:
        err.event_id = event_id
        raise
    raise ProtocolError(
        f"unknown event type {kind!r} for this session", "invalid_event_type", "type", event_id
    )


def _pcm(audio) -> bytes:
    if not isinstance(audio, str):
        raise ProtocolError("'audio' must be a base64 string", "invalid_audio", "audio")
    try:
        pcm = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("'audio' is not valid base64", "invalid_audio", "audio") from None
    if not pcm:
        raise ProtocolError("'audio' is empty", "invalid_audio", "audio")
    if len(pcm) % 2:
        raise ProtocolError(
            "'audio' must be 16-bit PCM (an even number of bytes)", "invalid_audio_format", "audio"
        )
    return pcm


def _openai_session(session, current: SessionConfig) -> SessionConfig:
    """OpenAI's session.update `session` -> the new settings (absent keys keep theirs)."""
    if not isinstance(session, dict):
        raise ProtocolError("session.update needs a 'session' object", "invalid_value", "session")
    if session.get("type", "transcription") != "transcription":
        raise ProtocolError(
            "only transcription sessions are served here (session.type 'transcription')",
            "invalid_value",
            "session.type",
        )
    audio_input = (session.get("audio") or {}).get("input") or {}
    config = current
    if "format" in audio_input:
        fmt = audio_input["format"] or {}
        if fmt.get("type", "audio/pcm") != "audio/pcm":
            raise ProtocolError(
                f"audio format {fmt.get('type')!r} is not supported: use audio/pcm",
                "invalid_value",
                "session.audio.input.format.type",
            )
        rate = fmt.get("rate", 24000)
        if rate not in PCM_RATES:
            raise ProtocolError(
                f"audio/pcm rate {rate!r} is not supported: use 24000 (or 16000)",
                "invalid_value",
                "session.audio.input.format.rate",
            )
        config = replace(config, rate=rate)
    if "transcription" in audio_input:
        given = audio_input["transcription"] or {}
        for name in ("model", "language", "prompt"):
            if given.get(name) is not None and not isinstance(given[name], str):
                raise ProtocolError(
                    f"transcription.{name} must be a string",
                    "invalid_value",
                    f"session.audio.input.transcription.{name}",
                )
        config = replace(
            config,
            transcription=TranscriptionConfig(
                given.get("model") or config.transcription.model,
                given.get("language") or None,
                given.get("prompt") or None,
            ),
        )
    if "turn_detection" in audio_input:
        config = replace(config, turn_detection=_server_vad(audio_input["turn_detection"]))
    return config


def _server_vad(given) -> ServerVad | None:
    if given is None:
        return None
    param = "session.audio.input.turn_detection"
    if not isinstance(given, dict) or given.get("type") != "server_vad":
        raise ProtocolError(
            "turn_detection must be null or {type: 'server_vad', ...}", "invalid_value", param
        )
    defaults = ServerVad()
    threshold = given.get("threshold", defaults.threshold)
    prefix = given.get("prefix_padding_ms", defaults.prefix_padding_ms)
    silence = given.get("silence_duration_ms", defaults.silence_duration_ms)
    if not _number(threshold) or not 0 < threshold < 1:
        raise ProtocolError("threshold must be in (0, 1)", "invalid_value", f"{param}.threshold")
    for name, value in (("prefix_padding_ms", prefix), ("silence_duration_ms", silence)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 10_000:
            raise ProtocolError(
                f"{name} must be a whole number of ms from 0 to 10000",
                "invalid_value",
                f"{param}.{name}",
            )
    return ServerVad(float(threshold), prefix, silence)


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# ---- server events -----------------------------------------------------------------------------
_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    return f"{prefix}_{next(_ids):08d}"


def error_event(protocol: str, err: ProtocolError) -> dict:
    if protocol == VLLM:  # vLLM's ErrorEvent: the message as `error`
        return {"type": "error", "error": err.message, "code": err.code, "param": err.param}
    return {
        "type": "error",
        "event_id": new_id("event"),
        "error": {
            "type": err.error_type,
            "code": err.code,
            "message": err.message,
            "param": err.param,
            "event_id": err.event_id,
        },
    }


def openai_event(kind: str, **fields) -> dict:
    return {"type": kind, "event_id": new_id("event"), **fields}
