"""/v1/audio/transcriptions and /v1/audio/translations <-> whisper_lora.

Form fields as OpenAI's (file, model, language, prompt, temperature, response_format,
timestamp_granularities[], stream); every other form field is one of whisper_lora's decoding
options (`beam_size`, `suppress_tokens`, `vad_filter`, `vad_parameters`, ...) and goes into
`sampling_parameters` as given (JSON values parsed, anything else as its string, which
whisper_lora reads by the key's type), so whisper_lora names a wrong key or value itself.
`hotwords` and `prefix` (faster-whisper's) are text whatever they look like ("2024" stays a
string).

`file` is any audio or video file FFmpeg decodes, sent to whisper_lora as is (it decodes it,
bounded); verbose_json's `duration` comes from the container's header through the same PyAV
probe (lora_media.audio_file), nothing decoded here.

temperature: OpenAI documents 0 as "use log probability to automatically increase the
temperature until certain thresholds are hit", which is whisper_lora's default schedule
(0.0, 0.2, ... 1.0 with the compression-ratio / log-probability checks). So 0 or no temperature
= that schedule; a value above 0 = that one temperature, no fallback.
"""

import json
from dataclasses import dataclass, field

from lora_media.whisper_languages import LANGUAGES
from lora_openai.errors import bad_request

RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
SEGMENT_FORMATS = ("verbose_json", "srt", "vtt")  # need segments: timestamps=true to Triton
STREAM_FORMATS = ("json", "text")
# OpenAI fields read here; the rest of the form is decoding options.
_OPENAI_FIELDS = {
    "file",
    "model",
    "language",
    "prompt",
    "temperature",
    "response_format",
    "timestamp_granularities[]",
    "timestamp_granularities",
    "stream",
    "include[]",
    "include",
    "chunking_strategy",  # whisper_lora always decodes in 30 s windows
}
_TEXT_OPTIONS = {"hotwords", "prefix"}  # decoding options that are text, never JSON


@dataclass(frozen=True)
class SpeechRequest:
    """One transcription or translation request, checked."""

    task: str  # "transcribe" | "translate"
    model: str
    audio: bytes
    language: str | None = None
    prompt: str | None = None
    temperature: float | None = None
    response_format: str = "json"
    stream: bool = False
    decoding: dict = field(default_factory=dict)

    @property
    def timestamps(self) -> bool:
        return self.response_format in SEGMENT_FORMATS

    def triton_fields(self) -> dict:
        """whisper_lora inputs (lora_client.requests' field dict form)."""
        fields: dict = {"audio_file": self.audio, "task": self.task}
        if self.language:
            fields["language"] = self.language
        if self.prompt:
            fields["prompt"] = self.prompt
        if self.timestamps:
            fields["timestamps"] = True
        if self.stream:
            fields["stream"] = True
        sampling = dict(self.decoding)
        if self.temperature:  # 0 / absent: whisper_lora's fallback schedule (module docstring)
            sampling["temperature"] = self.temperature
        if sampling:
            fields["sampling_parameters"] = json.dumps(sampling)
        return fields


def _form_value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _flag(value, name: str) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "1"):
        return True
    if text in ("false", "0", ""):
        return False
    raise bad_request(f"'{name}' must be true or false, got {value!r}", name)


def parse_form(task: str, form: list[tuple[str, object]], audio: bytes | None) -> SpeechRequest:
    """Multipart form items (name, value) -> SpeechRequest; every problem is a 400."""
    single: dict[str, object] = {}
    granularities: list[str] = []
    includes: list[str] = []
    decoding: dict = {}
    for name, value in form:
        if name in ("timestamp_granularities[]", "timestamp_granularities"):
            granularities.append(str(value))
        elif name in ("include[]", "include"):
            includes.append(str(value))
        elif name in _OPENAI_FIELDS:
            single[name] = value
        elif isinstance(value, str):
            decoding[name] = value if name in _TEXT_OPTIONS else _form_value(value)
        else:
            raise bad_request(f"unexpected file in form field '{name}'", name)
    if audio is None:
        raise bad_request("'file' is required (the audio, as a multipart file)", "file")
    if not audio:
        raise bad_request("'file' is empty", "file")
    model = str(single.get("model") or "")
    if not model:
        raise bad_request("'model' is required", "model")
    response_format = str(single.get("response_format") or "json")
    if response_format not in RESPONSE_FORMATS:
        raise bad_request(
            f"response_format must be one of {', '.join(RESPONSE_FORMATS)}, got "
            f"'{response_format}'",
            "response_format",
        )
    for granularity in granularities:
        if granularity != "segment":
            raise bad_request(
                f"timestamp_granularities '{granularity}' is not supported (only 'segment')",
                "timestamp_granularities",
            )
    if granularities and response_format != "verbose_json":
        raise bad_request(
            "timestamp_granularities needs response_format verbose_json", "timestamp_granularities"
        )
    if includes:
        raise bad_request(f"include {includes} is not supported", "include")
    temperature = None
    if single.get("temperature") not in (None, ""):
        try:
            temperature = float(single["temperature"])
        except ValueError:
            raise bad_request("temperature must be a number", "temperature") from None
        if not 0 <= temperature <= 1:
            raise bad_request(f"temperature must be in [0, 1], got {temperature}", "temperature")
    stream = _flag(single.get("stream", "false"), "stream")
    if stream and response_format not in STREAM_FORMATS:
        raise bad_request(
            f"stream=true sends transcript.text events; use response_format json or text, "
            f"not {response_format}",
            "stream",
        )
    return SpeechRequest(
        task=task,
        model=model,
        audio=audio,
        language=str(single.get("language") or "") or None,
        prompt=str(single.get("prompt") or "") or None,
        temperature=temperature,
        response_format=response_format,
        stream=stream,
        decoding=decoding,
    )


# ---- responses ---------------------------------------------------------------------------------
def audio_duration(audio: bytes) -> float | None:
    """Seconds of an audio file as its container states them (FFmpeg's header probe, the one
    whisper_lora's decoder uses; nothing decoded), None when it does not say."""
    from lora_media.audio_file import AudioFileError, probe_audio_file

    try:
        stated = probe_audio_file(audio, name="file").duration_s
    except AudioFileError:
        return None
    return round(stated, 3) if stated is not None else None


def openai_segments(segments: list[dict]) -> list[dict]:
    """whisper_lora segments -> OpenAI's verbose_json segments (openai-whisper's fields).
    whisper_lora returns no token ids and no window offsets: `tokens` is [] and `seek` the
    segment's start in 10 ms frames."""
    return [
        {
            "id": index,
            "seek": int(round(segment["start"] * 100)),
            "start": segment["start"],
            "end": segment["end"],
            "text": segment["text"],
            "tokens": [],
            "temperature": segment.get("temperature", 0.0),
            "avg_logprob": segment.get("avg_logprob"),
            "compression_ratio": segment.get("compression_ratio"),
            "no_speech_prob": segment.get("no_speech_prob"),
        }
        for index, segment in enumerate(segments)
    ]


def _timestamp(seconds: float, marker: str) -> str:
    millis = int(round(max(seconds, 0.0) * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{marker}{millis:03d}"


def _cue_text(segment: dict) -> str:
    return segment["text"].strip().replace("-->", "->")


def to_srt(segments: list[dict]) -> str:
    return "".join(
        f"{index}\n{_timestamp(s['start'], ',')} --> {_timestamp(s['end'], ',')}\n"
        f"{_cue_text(s)}\n\n"
        for index, s in enumerate(segments, start=1)
    )


def to_vtt(segments: list[dict]) -> str:
    cues = "".join(
        f"{_timestamp(s['start'], '.')} --> {_timestamp(s['end'], '.')}\n{_cue_text(s)}\n\n"
        for s in segments
    )
    return "WEBVTT\n\n" + cues


def render(request: SpeechRequest, outputs: dict) -> tuple[str, object]:
    """whisper_lora's final outputs -> (media type, body) for request.response_format."""
    text = outputs.get("text_output", "")
    segments = json.loads(outputs.get("segments") or "[]")
    fmt = request.response_format
    if fmt == "json":
        return "application/json", {"text": text}
    if fmt == "text":
        return "text/plain", text + "\n"
    if fmt == "srt":
        return "application/x-subrip", to_srt(segments)
    if fmt == "vtt":
        return "text/vtt", to_vtt(segments)
    language = outputs.get("language") or request.language or ""
    duration = audio_duration(request.audio)
    if duration is None:
        duration = segments[-1]["end"] if segments else 0.0
    return "application/json", {
        "task": request.task,
        "language": LANGUAGES.get(language, language),
        "duration": duration,
        "text": text,
        "segments": openai_segments(segments),
    }


def delta_event(delta: str) -> dict:
    return {"type": "transcript.text.delta", "delta": delta}


def done_event(text: str) -> dict:
    return {"type": "transcript.text.done", "text": text}
