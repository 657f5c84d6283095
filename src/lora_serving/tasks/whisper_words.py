"""Word timestamps: openai-whisper's `whisper/timing.py`, step for step.

The engine (vllm_plugin/whisper_alignment) runs one teacher-forced request per window,
    <|startoftranscript|> <|xx|> <|task|> <|notimestamps|> text tokens <|endoftext|>
with the request's adapter, and hands back the matrix of its alignment heads' QK and each text
token's probability (both computed there, in the engine process). Here: DTW over the negated
matrix (openai-whisper's `dtw_cpu`, same float32 cost and tie-breaking, computed by
anti-diagonals), jumps -> token times, `split_to_word_tokens`, `merge_punctuations`, and
`add_word_timestamps`' clamps and segment boundary rules. Times are in seconds; 50 encoder frames
a second.
"""

import itertools
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

TOKENS_PER_SECOND = 50  # encoder frames (openai-whisper's TOKENS_PER_SECOND)
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
# openai-whisper splits these languages' words at unicode points, not spaces.
UNICODE_SPLIT_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})
SENTENCE_END_MARKS = ".。!！?？"


@dataclass
class WordTiming:
    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


# ---- DTW ---------------------------------------------------------------------------------------
def dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """openai-whisper's dtw_cpu + backtrace on a (tokens, frames) cost: (text_indices,
    time_indices) of the path. Cells on one anti-diagonal depend only on the two before it, so
    each diagonal is one vectorised step; the float32 cost and the tie-breaking are the same."""
    x = np.asarray(x, dtype=np.float64)
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf, dtype=np.float32)
    trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
    cost[0, 0] = 0
    for diagonal in range(2, n + m + 1):
        i = np.arange(max(1, diagonal - m), min(n, diagonal - 1) + 1)
        j = diagonal - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        t = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        cost[i, j] = x[i - 1, j - 1] + np.choose(t, [c0, c1, c2])
        trace[i, j] = t
    return backtrace(trace)


def backtrace(trace: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    trace = trace.copy()
    i, j = trace.shape[0] - 1, trace.shape[1] - 1
    trace[0, :] = 2
    trace[:, 0] = 1
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        step = trace[i, j]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        elif step == 2:
            j -= 1
        else:
            raise ValueError("Unexpected trace[i, j]")
    result = np.array(path)[::-1, :].T
    return result[0], result[1]


# ---- tokens -> words -------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (what Whisper's BPE tokens are written in) -> bytes."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, codes, strict=True)}


class TokenText:
    """Tokens -> text as tiktoken's `decode` with errors="replace" gives it (openai-whisper's
    `decode_with_timestamps`): bytes joined, then decoded, special tokens written out."""

    def __init__(self, tokenizer):
        self.pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        self.special = {int(i) for i in tokenizer.added_tokens_decoder}
        self.decoder = _byte_decoder()

    def bytes_of(self, token: int) -> bytes:
        piece = self.pieces[token]
        if token in self.special or piece is None:
            return (piece or "").encode()
        return bytes(self.decoder[ch] for ch in piece)

    def __call__(self, tokens: Sequence[int]) -> str:
        return b"".join(self.bytes_of(t) for t in tokens).decode("utf-8", errors="replace")


def split_tokens_on_unicode(tokens: list[int], decode: Callable[[list[int]], str]):
    decoded_full = decode(tokens)
    replacement_char = "\ufffd"
    words, word_tokens, current_tokens = [], [], []
    unicode_offset = 0
    for token in tokens:
        current_tokens.append(token)
        decoded = decode(current_tokens)
        if (
            replacement_char not in decoded
            or decoded_full[unicode_offset + decoded.index(replacement_char)] == replacement_char
        ):
            words.append(decoded)
            word_tokens.append(current_tokens)
            current_tokens = []
            unicode_offset += len(decoded)
    return words, word_tokens


def split_to_word_tokens(
    tokens: list[int], decode: Callable[[list[int]], str], *, eot: int, language: str
):
    """openai-whisper's Tokenizer.split_to_word_tokens: (words, their tokens)."""
    subwords, subword_tokens_list = split_tokens_on_unicode(tokens, decode)
    if language in UNICODE_SPLIT_LANGUAGES:
        return subwords, subword_tokens_list
    words: list[str] = []
    word_tokens: list[list[int]] = []
    for subword, subword_tokens in zip(subwords, subword_tokens_list, strict=True):
        special = subword_tokens[0] >= eot
        with_space = subword.startswith(" ")
        punctuation = subword.strip() in string.punctuation
        if special or with_space or punctuation or len(words) == 0:
            words.append(subword)
            word_tokens.append(subword_tokens)
        else:
            words[-1] = words[-1] + subword
            word_tokens[-1].extend(subword_tokens)
    return words, word_tokens


def word_timings(
    matrix: np.ndarray,
    probabilities: list[float],
    text_tokens: list[int],
    split: Callable[[list[int]], tuple[list[str], list[list[int]]]],
    eot: int,
) -> list[WordTiming]:
    """find_alignment's second half: the matrix's DTW path -> each word's start and end."""
    if not text_tokens:
        return []
    text_indices, time_indices = dtw(-np.asarray(matrix, dtype=np.float64))
    words, word_tokens = split(text_tokens + [eot])
    if len(word_tokens) <= 1:
        return []
    word_boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    start_times = jump_times[word_boundaries[:-1]]
    end_times = jump_times[word_boundaries[1:]]
    word_probabilities = [
        np.mean(probabilities[i:j])
        for i, j in zip(word_boundaries[:-1], word_boundaries[1:], strict=True)
    ]
    return [
        WordTiming(word, tokens, float(start), float(end), float(probability))
        for word, tokens, start, end, probability in zip(
            words, word_tokens, start_times, end_times, word_probabilities, strict=False
        )
    ]


def merge_punctuations(alignment: list[WordTiming], prepended: str, appended: str) -> None:
    """openai-whisper's: punctuation joins the word after it (prepended) or before it."""
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        previous, following = alignment[i], alignment[j]
        if previous.word.startswith(" ") and previous.word.strip() in prepended:
            following.word = previous.word + following.word
            following.tokens = previous.tokens + following.tokens
            previous.word = ""
            previous.tokens = []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        previous, following = alignment[i], alignment[j]
        if not previous.word.endswith(" ") and following.word in appended:
            previous.word = previous.word + following.word
            previous.tokens = previous.tokens + following.tokens
            following.word = ""
            following.tokens = []
        else:
            i = j
        j += 1


def add_word_timestamps(
    segments: list[dict],
    alignment: list[WordTiming],
    *,
    time_offset: float,
    last_speech_timestamp: float,
    prepend_punctuations: str = PREPEND_PUNCTUATIONS,
    append_punctuations: str = APPEND_PUNCTUATIONS,
) -> None:
    """openai-whisper's add_word_timestamps after find_alignment: the duration clamps, the
    punctuation merge, then each segment's `words` and its start/end refined by them.
    `segments`: the window's, each with `tokens` (its text tokens), `start` and `end`
    (seconds of the recording); `alignment`: word_timings of all their tokens together."""
    if not segments:
        return
    durations = np.array([t.end - t.start for t in alignment])
    durations = durations[durations.nonzero()]
    median_duration = np.median(durations) if len(durations) > 0 else 0.0
    median_duration = min(0.7, float(median_duration))
    max_duration = median_duration * 2
    if len(durations) > 0:
        for i in range(1, len(alignment)):
            if alignment[i].end - alignment[i].start > max_duration:
                if alignment[i].word in SENTENCE_END_MARKS:
                    alignment[i].end = alignment[i].start + max_duration
                elif alignment[i - 1].word in SENTENCE_END_MARKS:
                    alignment[i].start = alignment[i].end - max_duration
    merge_punctuations(alignment, prepend_punctuations, append_punctuations)

    word_index = 0
    for segment in segments:
        text_tokens = segment["tokens"]
        saved_tokens = 0
        words: list[dict] = []
        while word_index < len(alignment) and saved_tokens < len(text_tokens):
            timing = alignment[word_index]
            if timing.word:
                words.append(
                    {
                        "word": timing.word,
                        "start": round(time_offset + timing.start, 2),
                        "end": round(time_offset + timing.end, 2),
                        "probability": timing.probability,
                    }
                )
            saved_tokens += len(timing.tokens)
            word_index += 1
        if words:
            if words[0]["end"] - last_speech_timestamp > median_duration * 4 and (
                words[0]["end"] - words[0]["start"] > max_duration
                or (len(words) > 1 and words[1]["end"] - words[0]["start"] > max_duration * 2)
            ):
                if len(words) > 1 and words[1]["end"] - words[1]["start"] > max_duration:
                    boundary = max(words[1]["end"] / 2, words[1]["end"] - max_duration)
                    words[0]["end"] = words[1]["start"] = boundary
                words[0]["start"] = max(0, words[0]["end"] - max_duration)
            if segment["start"] < words[0]["end"] and segment["start"] - 0.5 > words[0]["start"]:
                words[0]["start"] = max(0, min(words[0]["end"] - median_duration, segment["start"]))
            else:
                segment["start"] = words[0]["start"]
            if segment["end"] > words[-1]["start"] and segment["end"] + 0.5 < words[-1]["end"]:
                words[-1]["end"] = max(words[-1]["start"] + median_duration, segment["end"])
            else:
                segment["end"] = words[-1]["end"]
            last_speech_timestamp = segment["end"]
        segment["words"] = words


def last_word_end(segments: list[dict]) -> float | None:
    """openai-whisper's get_end: the last word's end, else the last segment's end."""
    return next(
        (w["end"] for s in reversed(segments) for w in reversed(s.get("words", []))),
        segments[-1]["end"] if segments else None,
    )


def window_text_tokens(segments: list[dict], eot: int) -> list[int]:
    """The window's text tokens, all segments together (add_word_timestamps' `text_tokens`)."""
    return list(
        itertools.chain.from_iterable([t for t in s["tokens"] if t < eot] for s in segments)
    )
