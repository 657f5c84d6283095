"""lora_openai.subtitles lays caption cues out exactly as openai-whisper's own writers do.

The judge is openai-whisper 20250625's WriteSRT / WriteVTT (whisper/utils.py), run in its own
environment (scripts/openai_whisper.sh; tests/openai_whisper/write_subtitles.py) on the same
results, for every writer option and their combinations.
"""

import json
import re

import pytest

from lora_openai.subtitles import WriterOptions, to_srt, to_vtt
from tests.openai_whisper import ROOT, install_reference_env, run_in_reference_env


def _words(start: float, *pieces: tuple[str, float]) -> list[dict]:
    words, at = [], start
    for text, length in pieces:
        words.append({"word": text, "start": round(at, 2), "end": round(at + length, 2)})
        at += length + 0.04
    return words


def _segment(words: list[dict], text: str | None = None) -> dict:
    return {
        "start": words[0]["start"],
        "end": words[-1]["end"],
        "text": text if text is not None else "".join(w["word"] for w in words),
        "words": words,
    }


SEGMENTS = [
    _segment(_words(0.0, (" The", 0.16), (" quick", 0.28), (" brown", 0.3), (" fox", 0.4))),
    # A pause over 3 s before this segment (a cue break when lines are limited).
    _segment(
        _words(
            4.5,
            (" jumped", 0.3),
            (" over", 0.2),
            (" the", 0.1),
            (" extraordinarily", 0.9),
            (" lazy", 0.3),
            (" dog.", 0.35),
        )
    ),
    _segment(_words(7.1, (" A", 0.1), (" -->", 0.2), (" B,", 0.2), (" fine?", 0.3))),
    # Hours in the timestamps; a word that starts where the last one ended (no gap cue).
    {
        "start": 3723.5,
        "end": 3724.4,
        "text": " Late words.",
        "words": [
            {"word": " Late", "start": 3723.5, "end": 3723.9},
            {"word": " words.", "start": 3723.9, "end": 3724.4},
        ],
    },
]
OPTIONS = [
    {},
    {"max_line_width": 20},
    {"max_line_width": 20, "max_line_count": 2},
    {"max_line_width": 12, "max_line_count": 1},
    {"highlight_words": True},
    {"max_line_width": 16, "max_line_count": 2, "highlight_words": True},
    {"max_words_per_line": 3},
    {"max_words_per_line": 2, "max_line_width": 14, "max_line_count": 2},
    {"max_line_count": 2},  # no effect without max_line_width, as in openai-whisper
]
NO_WORDS = [{k: v for k, v in segment.items() if k != "words"} for segment in SEGMENTS]


@pytest.fixture(scope="module")
def openai_whisper_written(request):
    install_reference_env(request)
    cases = [{"result": {"segments": SEGMENTS}, "options": o} for o in OPTIONS]
    cases.append({"result": {"segments": NO_WORDS}, "options": {}})
    script = ROOT / "tests" / "openai_whisper" / "write_subtitles.py"
    return json.loads(run_in_reference_env(script, stdin=json.dumps(cases)))


def _hours_as_openai_whisper_writes_vtt(vtt: str) -> str:
    """openai-whisper's VTT leaves out a zero hour; ours always writes it (OpenAI's API does)."""
    return re.sub(r"(?m)(^|--> )00:(\d\d:\d\d\.\d{3})", r"\1\2", vtt)


@pytest.mark.parametrize("index", range(len(OPTIONS)), ids=[json.dumps(o) for o in OPTIONS])
def test_word_cues_equal_openai_whisper(openai_whisper_written, index):
    options = WriterOptions(**OPTIONS[index])
    expected = openai_whisper_written[index]
    assert to_srt(SEGMENTS, options) == expected["srt"]
    assert _hours_as_openai_whisper_writes_vtt(to_vtt(SEGMENTS, options)) == expected["vtt"]


def test_segment_cues_equal_openai_whisper(openai_whisper_written):
    expected = openai_whisper_written[-1]
    assert to_srt(NO_WORDS) == expected["srt"]
    assert _hours_as_openai_whisper_writes_vtt(to_vtt(NO_WORDS)) == expected["vtt"]


def _cue_count(srt: str) -> int:
    return len(re.findall(r"(?m)^\d\d:\d\d:\d\d,\d{3} --> ", srt))


def test_options_change_the_layout():
    assert _cue_count(to_srt(SEGMENTS)) == 4  # one cue per segment
    assert _cue_count(to_srt(SEGMENTS, WriterOptions(max_line_width=12, max_line_count=1))) > 4
    highlighted = to_srt(SEGMENTS, WriterOptions(highlight_words=True))
    assert "<u>quick</u>" in highlighted and "<u>The</u>" in highlighted
