"""Better word starts and ends than openai-whisper's (`word_timestamps_refine`, default on).

openai-whisper's DTW path is continuous: a word after a pause "starts" where the word before it
ended, absorbing the silence between them (seen on espeak-ng words 0.6-1.4 s apart: starts
0.13-1.14 s early). Silero VAD, which the project already runs for `vad_filter`, says where
speech is; a word whose span begins or ends in non-speech is trimmed to the speech inside it
(`_speech_of` says which speech is the word's own).
A word with no speech detected inside it keeps openai-whisper's times, and so does the
window's seek (the next window starts where openai-whisper's would). A refined segment spans
its words.
"""

from lora_serving.audio import WHISPER_SAMPLE_RATE
from lora_serving.tasks.whisper_vad import VadOptions

# Tighter than vad_filter's defaults: pauses of 100 ms split speech; 30 ms of padding (one
# Silero frame) keeps soft onsets and releases.
SPEECH_OPTIONS = VadOptions(min_silence_duration_ms=100, speech_pad_ms=30)

Span = tuple[float, float]  # seconds


def speech_spans(chunks: list[tuple[int, int]]) -> list[Span]:
    """SpeechDetector chunks (16 kHz samples) -> seconds."""
    return [(start / WHISPER_SAMPLE_RATE, end / WHISPER_SAMPLE_RATE) for start, end in chunks]


def _speech_of(start: float, end: float, speech: list[Span]) -> list[Span]:
    """The speech spans that belong to a word spanning [start, end]. A span that began before
    the word and ends inside it, with more speech after it in the word, is the previous word's
    tail (DTW's word edges err by a frame or so, and the spans are padded); likewise a span
    that starts inside the word and runs past its end after other speech in it is the next
    word's onset. Neither counts."""
    inside = [(a, b) for a, b in speech if a < end and b > start]
    if len(inside) > 1 and inside[0][0] < start:
        inside = inside[1:]
    if len(inside) > 1 and inside[-1][1] > end:
        inside = inside[:-1]
    return inside


def refine(segments: list[dict], speech: list[Span]) -> None:
    """Trim each word of `segments` (times in the same seconds as `speech`) to the speech
    inside it; then each segment with words to [first word's start, last word's end]."""
    for segment in segments:
        words = segment.get("words") or []
        for word in words:
            inside = _speech_of(word["start"], word["end"], speech)
            if inside:
                word["start"] = round(max(word["start"], inside[0][0]), 2)
                word["end"] = round(min(word["end"], inside[-1][1]), 2)
        if words:
            segment["start"], segment["end"] = words[0]["start"], words[-1]["end"]
