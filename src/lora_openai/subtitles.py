"""Subtitle cues (srt, vtt) from whisper_lora's segments, as openai-whisper writes them.

Without word timings every segment is one cue. With them (segments carrying `words`),
openai-whisper's writer options apply: `max_line_width` (characters per line), `max_line_count`
(lines per cue), `highlight_words` (one cue per word, the word underlined) and
`max_words_per_line`. `cues` is a line-for-line port of openai-whisper 20250625's
`SubtitlesWriter.iterate_result` (whisper/utils.py), quirks included, so a caption file reads
the same as openai-whisper's CLI writes it; tests/unit/test_subtitles.py runs openai-whisper's own
writer on the same results. Times are kept in whole milliseconds, as its formatted timestamps
compare them.
"""

import re
from collections.abc import Iterator
from dataclasses import dataclass

MAX_OPTION = 10_000  # a bound for the integer options, far above any caption


@dataclass(frozen=True)
class WriterOptions:
    """openai-whisper's subtitle writer options (None / False: not given)."""

    max_line_width: int | None = None
    max_line_count: int | None = None
    highlight_words: bool = False
    max_words_per_line: int | None = None

    @property
    def given(self) -> bool:
        return bool(
            self.max_line_width
            or self.max_line_count
            or self.highlight_words
            or self.max_words_per_line
        )


def _ms(seconds: float) -> int:
    return round(max(seconds, 0.0) * 1000.0)


def _first_start(segments: list[dict]) -> float | None:
    return next(
        (w["start"] for s in segments for w in s["words"]),
        segments[0]["start"] if segments else None,
    )


def _subtitles(segments: list[dict], options: WriterOptions) -> Iterator[list[dict]]:
    """Groups of word timings, one per cue (openai-whisper's `iterate_subtitles`)."""
    max_line_count = options.max_line_count
    preserve_segments = max_line_count is None or options.max_line_width is None
    max_line_width = options.max_line_width or 1000
    max_words_per_line = options.max_words_per_line or 1000
    line_len = 0
    line_count = 1
    subtitle: list[dict] = []
    last = _first_start(segments) or 0.0
    for segment in segments:
        chunk_index = 0
        words_count = max_words_per_line
        while chunk_index < len(segment["words"]):
            remaining_words = len(segment["words"]) - chunk_index
            if max_words_per_line > len(segment["words"]) - chunk_index:
                words_count = remaining_words
            for i, original_timing in enumerate(
                segment["words"][chunk_index : chunk_index + words_count]
            ):
                timing = dict(original_timing)
                long_pause = not preserve_segments and timing["start"] - last > 3.0
                has_room = line_len + len(timing["word"]) <= max_line_width
                seg_break = i == 0 and len(subtitle) > 0 and preserve_segments
                if line_len > 0 and has_room and not long_pause and not seg_break:
                    line_len += len(timing["word"])  # line continuation
                else:  # new line
                    timing["word"] = timing["word"].strip()
                    if (
                        len(subtitle) > 0
                        and max_line_count is not None
                        and (long_pause or line_count >= max_line_count)
                        or seg_break
                    ):  # subtitle break
                        yield subtitle
                        subtitle = []
                        line_count = 1
                    elif line_len > 0:  # line break
                        line_count += 1
                        timing["word"] = "\n" + timing["word"]
                    line_len = len(timing["word"].strip())
                subtitle.append(timing)
                last = timing["start"]
            chunk_index += max_words_per_line
    if len(subtitle) > 0:
        yield subtitle


def cues(segments: list[dict], options: WriterOptions | None = None) -> Iterator[tuple]:
    """(start ms, end ms, text) per cue."""
    options = options or WriterOptions()
    if segments and "words" in segments[0]:
        for subtitle in _subtitles(segments, options):
            start, end = _ms(subtitle[0]["start"]), _ms(subtitle[-1]["end"])
            text = "".join(word["word"] for word in subtitle)
            if not options.highlight_words:
                yield start, end, text
                continue
            last = start
            words = [timing["word"] for timing in subtitle]
            for i, this_word in enumerate(subtitle):
                word_start, word_end = _ms(this_word["start"]), _ms(this_word["end"])
                if last != word_start:
                    yield last, word_start, text
                yield (
                    word_start,
                    word_end,
                    "".join(
                        re.sub(r"^(\s*)(.*)$", r"\1<u>\2</u>", word) if j == i else word
                        for j, word in enumerate(words)
                    ),
                )
                last = word_end
    else:
        for segment in segments:
            text = segment["text"].strip().replace("-->", "->")
            yield _ms(segment["start"]), _ms(segment["end"]), text


def _timestamp(millis: int, marker: str) -> str:
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{marker}{millis:03d}"


def to_srt(segments: list[dict], options: WriterOptions | None = None) -> str:
    return "".join(
        f"{index}\n{_timestamp(start, ',')} --> {_timestamp(end, ',')}\n{text}\n\n"
        for index, (start, end, text) in enumerate(cues(segments, options), start=1)
    )


def to_vtt(segments: list[dict], options: WriterOptions | None = None) -> str:
    body = "".join(
        f"{_timestamp(start, '.')} --> {_timestamp(end, '.')}\n{text}\n\n"
        for start, end, text in cues(segments, options)
    )
    return "WEBVTT\n\n" + body
