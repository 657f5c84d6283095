"""Whisper timestamps: OpenAI's timestamp rules for one request's logits, tokens -> segments.

Greedy decoding on its own almost never emits a timestamp before the end of the audio, so a
window would come back as one segment. Whisper's reference decoder (openai-whisper
`ApplyTimestampRules`, transformers `WhisperTimeStampLogitsProcessor`) gets sentence-level
segments from a few rules applied to the logits at every step; `TimestampRules` is those rules
for one request, applied in the engine with Whisper's other decoding rules (whisper_logits).
"""

import math
from dataclasses import dataclass

import torch

SECONDS_PER_TIMESTAMP = 0.02  # <|0.00|>, <|0.02|>, ... <|30.00|>
MAX_INITIAL_TIMESTAMP_S = 1.0  # openai-whisper's default: speech starts within the first second


@dataclass(frozen=True)
class TimestampRules:
    """openai-whisper's ApplyTimestampRules (= transformers' WhisperTimeStampLogitsProcessor)
    for one request's logits row.

    Output tokens start right after <|transcribe|>/<|translate|>: the first is a timestamp. Of
    the control tokens only <|notimestamps|> is suppressed here, as in both references; the
    others that Whisper must never emit (<|startoftranscript|>, <|translate|>, <|transcribe|>,
    <|startofprev|>, <|startoflm|>, <|nospeech|>) are in the suppress_tokens list applied before
    (whisper_logits); language tokens are not suppressed at all.
    """

    timestamp_begin: int  # id of <|0.00|>; every id from here on is a timestamp
    eot: int  # <|endoftext|>; ids between it and timestamp_begin are control tokens
    max_initial_timestamp_index: int = round(MAX_INITIAL_TIMESTAMP_S / SECONDS_PER_TIMESTAMP)

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        first_timestamp = self.timestamp_begin
        logits[first_timestamp - 1] = -math.inf  # <|notimestamps|>, the id before <|0.00|>
        if not output_ids:
            logits[:first_timestamp] = -math.inf
            logits[first_timestamp + self.max_initial_timestamp_index + 1 :] = -math.inf
            return logits
        last_was_timestamp = output_ids[-1] >= first_timestamp
        penultimate_was_timestamp = len(output_ids) < 2 or output_ids[-2] >= first_timestamp
        if last_was_timestamp:
            if penultimate_was_timestamp:  # a segment just opened: text comes next
                logits[first_timestamp:] = -math.inf
            else:  # a segment just closed: the next one opens, or the transcript ends
                logits[: self.eot] = -math.inf
        timestamps = [token for token in output_ids if token >= first_timestamp]
        if timestamps:  # time never goes back; a closing time may open the next segment
            reopen = last_was_timestamp and not penultimate_was_timestamp
            lowest = timestamps[-1] if reopen else timestamps[-1] + 1
            logits[first_timestamp:lowest] = -math.inf
        # When all timestamps together are likelier than any single text token, take one.
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        if logprobs[first_timestamp:].logsumexp(dim=-1) > logprobs[:first_timestamp].max():
            logits[:first_timestamp] = -math.inf
        return logits


@dataclass(frozen=True)
class WindowReading:
    """One window's output tokens read the way openai-whisper's long-form transcription does.

    A segment is closed by the timestamp after its text; text not closed yet is `unfinished`.
    A closed segment is `confirmed` once the next timestamp follows its closing one (a pair, as
    `<|2.00|><|2.00|>`): only then is it certain to stay as read (see `final`).
    Times are seconds from the start of the window.
    """

    closed: list[tuple[float, float, list[int]]]  # (start, end, text tokens)
    unfinished: list[int]
    opened_at: float  # the timestamp that opened the unfinished text
    ends_after_text: bool  # last token: a timestamp right after text (a closed last segment)
    confirmed: int = 0  # how many of `closed` a following pair of timestamps confirmed
    paired: bool = False  # two timestamp tokens in a row somewhere
    last_time: float | None = None  # the last timestamp's time, if any

    def final(
        self, duration_s: float, *, cut_short: bool
    ) -> tuple[list[tuple[float, float, list[int]]], float]:
        """(segments, seconds consumed) once the window is decoded (`cut_short`: by max_tokens).

        openai-whisper's rule (transformers' and faster-whisper's too): a window without two
        timestamps in a row is one segment from the window's start to its last timestamp (to its
        end when there is none, or it is <|0.00|>), and the next window starts after it whole.
        Otherwise a window that ends on a closed segment has been said in full; else its
        unfinished text is dropped and the next window starts where the last closed segment
        ended, so no speech falls between windows.
        """
        if not self.paired:
            text = [token for *_, tokens in self.closed for token in tokens] + self.unfinished
            end = self.last_time or duration_s
            return ([(0.0, end, text)] if text else []), duration_s
        if not self.closed:
            text = [(self.opened_at, duration_s, self.unfinished)] if self.unfinished else []
            return text, duration_s
        said_in_full = self.ends_after_text and not cut_short
        consumed = min(duration_s, self.closed[-1][1])
        return self.closed, duration_s if said_in_full or consumed <= 0 else consumed


def read_window(token_ids: list[int], *, timestamp_begin: int, eot: int) -> WindowReading:
    """Output tokens (as decoded so far, or all of them) -> WindowReading."""
    tokens = token_ids[: token_ids.index(eot)] if eot in token_ids else list(token_ids)
    closed, text, opened_at = [], [], 0.0
    confirmed, paired, last_time, after_timestamp = 0, False, None, False
    for token in tokens:
        if token >= timestamp_begin:
            time = (token - timestamp_begin) * SECONDS_PER_TIMESTAMP
            if text:
                closed.append((opened_at, max(time, opened_at), text))
                text = []
            elif after_timestamp:  # a pair: every segment closed so far stays as read
                paired, confirmed = True, len(closed)
            opened_at, last_time, after_timestamp = time, time, True
        else:
            after_timestamp = False
            if token < eot:
                text.append(token)
    ends_after_text = len(tokens) >= 2 and tokens[-1] >= timestamp_begin and tokens[-2] < eot
    return WindowReading(closed, text, opened_at, ends_after_text, confirmed, paired, last_time)
