"""/v1/audio/transcriptions and /v1/audio/translations <-> whisper_lora.

Form fields as OpenAI's (file, model, language, prompt, temperature, response_format,
timestamp_granularities[], stream), openai-whisper's subtitle writer options (max_line_width,
max_line_count, highlight_words, max_words_per_line: srt and vtt only; they ask whisper_lora for
word timings, lora_openai.subtitles lays the cues out); every other form field is one of
whisper_lora's decoding options (`beam_size`, `suppress_tokens`, `vad_filter`, `vad_parameters`,
...) and goes into `sampling_parameters` as given (JSON values parsed, anything else as its
string, which whisper_lora reads by the key's type), so whisper_lora names a wrong key or value
itself.
`hotwords` and `prefix` (faster-whisper's) are text whatever they look like ("2024" stays a
string).

`file` is any audio or video file FFmpeg decodes, sent to whisper_lora as is (it decodes it,
bounded); verbose_json's `duration` comes from the container's header through the same PyAV
probe (lora_media.audio_file), nothing decoded here.

timestamp_granularities[]: "segment" (the default), "word" or both, with verbose_json, as
OpenAI's API has them: "word" asks whisper_lora for `word_timestamps` and answers top-level
`words: [{word, start, end}]`; `segments` come when "segment" is asked or nothing is.

temperature: OpenAI documents 0 as "use log probability to automatically increase the
temperature until certain thresholds are hit", which is whisper_lora's default schedule
(0.0, 0.2, ... 1.0 with the compression-ratio / log-probability checks). So 0 or no temperature
= that schedule; a value above 0 = that one temperature, no fallback.
"""

import json
import re
from dataclasses import dataclass, field

from lora_media.whisper_languages import LANGUAGES
from lora_openai.errors import bad_request
from lora_openai.subtitles import MAX_OPTION, WriterOptions, to_srt, to_vtt

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
GRANULARITIES = ("segment", "word")
_WRITER_INTEGERS = ("max_line_width", "max_line_count", "max_words_per_line")
_WRITER_FIELDS = {*_WRITER_INTEGERS, "highlight_words"}
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
    granularities: tuple[str, ...] = ()
    writer: WriterOptions = field(default_factory=WriterOptions)

    @property
    def timestamps(self) -> bool:
        return self.response_format in SEGMENT_FORMATS

    @property
    def word_timestamps(self) -> bool:
        return "word" in self.granularities or self.writer.given

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
        if self.word_timestamps:
            sampling["word_timestamps"] = True
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


def _writer_options(fields: dict, response_format: str) -> WriterOptions:
    """openai-whisper's subtitle writer options from the form; each bad one is a 400 naming it."""
    for name in fields:
        if response_format not in ("srt", "vtt"):
            raise bad_request(
                f"'{name}' lays out subtitle cues: use response_format srt or vtt, not "
                f"{response_format}",
                name,
            )
    numbers = {}
    for name in _WRITER_INTEGERS:
        if name not in fields:
            continue
        text = str(fields[name]).strip()
        # ASCII digits only, and few of them: int() of a long digit string is itself costly.
        if not re.fullmatch(r"[0-9]{1,6}", text) or not 1 <= int(text) <= MAX_OPTION:
            raise bad_request(
                f"'{name}' must be a whole number from 1 to {MAX_OPTION}, got {fields[name]!r}",
                name,
            )
        numbers[name] = int(text)
    highlight = _flag(fields.get("highlight_words", "false"), "highlight_words")
    return WriterOptions(highlight_words=highlight, **numbers)


def parse_form(task: str, form: list[tuple[str, object]], audio: bytes | None) -> SpeechRequest:
    """Multipart form items (name, value) -> SpeechRequest; every problem is a 400."""
    single: dict[str, object] = {}
    writer_fields: dict[str, object] = {}
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
        elif name in _WRITER_FIELDS:
            writer_fields[name] = value
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
        if granularity not in GRANULARITIES:
            raise bad_request(
                f"timestamp_granularities '{granularity}' is not supported (segment or word)",
                "timestamp_granularities",
            )
    if granularities and response_format != "verbose_json":
        raise bad_request(
            "timestamp_granularities needs response_format verbose_json", "timestamp_granularities"
        )
    if includes:
        raise bad_request(f"include {includes} is not supported", "include")
    writer = _writer_options(writer_fields, response_format)
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
        granularities=tuple(dict.fromkeys(granularities)),
        writer=writer,
    )


def openai_words(segments: list[dict]) -> list[dict]:
    """Every segment's words as OpenAI's verbose_json `words` (no leading space, no probability)."""
    return [
        {"word": word["word"].strip(), "start": word["start"], "end": word["end"]}
        for segment in segments
        for word in segment.get("words", ())
    ]


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
        return "application/x-subrip", to_srt(segments, request.writer)
    if fmt == "vtt":
        return "text/vtt", to_vtt(segments, request.writer)
    language = outputs.get("language") or request.language or ""
    duration = audio_duration(request.audio)
    if duration is None:
        duration = segments[-1]["end"] if segments else 0.0
    body = {
        "task": request.task,
        "language": LANGUAGES.get(language, language),
        "duration": duration,
        "text": text,
    }
    if "word" in request.granularities:
        body["words"] = openai_words(segments)
    if "segment" in request.granularities or not request.granularities:
        body["segments"] = openai_segments(segments)
    return "application/json", body


def delta_event(delta: str) -> dict:
    return {"type": "transcript.text.delta", "delta": delta}


def done_event(text: str) -> dict:
    return {"type": "transcript.text.done", "text": text}
