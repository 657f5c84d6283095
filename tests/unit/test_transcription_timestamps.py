"""Whisper's timestamp rules (one request's logits row) and reading a window's segments."""

import itertools

import numpy as np
import pytest
import torch

from lora_serving.tasks.whisper_timestamps import TimestampRules, read_window

EOT, TS = 50257, 50364  # <|endoftext|>, <|0.00|> in Whisper's multilingual tokenizer
VOCAB = TS + 1501
TEXT = 440  # " The"
RULES = TimestampRules(timestamp_begin=TS, eot=EOT)


def text_likely() -> torch.Tensor:
    """Logits where text and <|endoftext|> beat all timestamps together (log 1501 < 10)."""
    logits = torch.zeros(VOCAB)
    logits[: EOT + 1] = 10.0
    return logits


def allowed(output_ids, logits=None) -> set[str]:
    """Which kinds of token the rules leave possible after output_ids."""
    row = RULES(output_ids, text_likely() if logits is None else logits)
    finite = torch.isfinite(row)
    kinds = set()
    if finite[:EOT].any():
        kinds.add("text")
    if finite[EOT]:
        kinds.add("eot")
    if finite[EOT + 2 : EOT + 2 + 99].any():  # <|en|> ... <|su|>
        kinds.add("language")
    if finite[TS:].any():
        kinds.add("timestamp")
    return kinds


def test_first_token_is_a_timestamp_within_the_first_second():
    row = RULES([], torch.zeros(VOCAB))
    assert torch.isfinite(row).nonzero().flatten().tolist() == list(range(TS, TS + 51))


@pytest.mark.parametrize(
    "output_ids, kinds",
    [
        ([TS], {"text", "eot", "language"}),  # a segment opened: its text follows
        ([TS, TEXT], {"text", "eot", "timestamp", "language"}),
        # closed: open the next, or end; "cannot be normal text" spares the control tokens
        ([TS, TEXT, TS + 150], {"eot", "timestamp", "language"}),
        ([TS, TEXT, TS + 150, TS + 160], {"text", "eot", "language"}),
    ],
)
def test_timestamps_come_in_pairs_around_text(output_ids, kinds):
    """openai-whisper's rules exactly; language tokens are left to the model, as there."""
    assert allowed(output_ids) == kinds


def test_time_never_goes_back_and_a_closing_time_may_reopen():
    row = RULES([TS, TEXT, TS + 150], torch.zeros(VOCAB))
    assert not torch.isfinite(row[TS : TS + 150]).any()
    assert torch.isfinite(row[TS + 150 :]).all()
    row = RULES([TS + 10, TEXT], torch.zeros(VOCAB))
    assert not torch.isfinite(row[TS : TS + 11]).any() and torch.isfinite(row[TS + 11])


def test_likelier_timestamps_than_any_text_token_force_a_timestamp():
    logits = torch.full((VOCAB,), -10.0)
    logits[TEXT] = 1.0  # the best single token is text ...
    logits[TS + 100 : TS + 200] = 0.0  # ... but the timestamps together are likelier
    assert allowed([TS, TEXT], logits) == {"timestamp"}
    logits[TEXT] = 10.0
    assert "text" in allowed([TS, TEXT], logits)


def test_of_the_control_tokens_only_notimestamps_is_suppressed():
    """As openai-whisper's ApplyTimestampRules and transformers' processor: the other control
    tokens are the suppress_tokens list's (whisper_logits), language tokens nobody's."""
    row = RULES([TS, TEXT], text_likely())
    assert row[TS - 1] == -torch.inf  # <|notimestamps|>
    assert torch.isfinite(row[EOT + 1 : TS - 1]).all()  # <|startoftranscript|>, <|de|>, ...


def read(tokens):
    return read_window(tokens, timestamp_begin=TS, eot=EOT)


def test_pairs_around_text_are_closed_segments_and_a_final_one_means_said_in_full():
    reading = read([TS, 1, 2, TS + 156, TS + 172, 3, TS + 336, EOT])
    assert reading.closed == [(0.0, 3.12, [1, 2]), (3.44, 6.72, [3])]
    assert reading.ends_after_text and not reading.unfinished
    assert reading.final(30.0, cut_short=False) == (reading.closed, 30.0)


def test_unfinished_text_is_dropped_and_the_next_window_starts_at_the_last_end():
    reading = read([TS, 1, TS + 100, TS + 110, 2, EOT])
    assert reading.closed == [(0.0, 2.0, [1])] and reading.unfinished == [2]
    assert reading.final(30.0, cut_short=False) == ([(0.0, 2.0, [1])], 2.0)
    closed_pair_then_end = read([TS, 1, TS + 100, TS + 110, EOT])
    assert closed_pair_then_end.final(30.0, cut_short=False)[1] == 2.0


def test_a_window_cut_short_by_max_tokens_is_not_said_in_full():
    reading = read([TS, 1, TS + 100, TS + 100, 2, TS + 150])
    assert reading.final(30.0, cut_short=False)[1] == 30.0
    assert reading.final(30.0, cut_short=True)[1] == 3.0


def test_a_window_without_two_timestamps_in_a_row_is_one_segment_from_its_start():
    """openai-whisper's transcribe() (and transformers', faster-whisper's): the segment starts
    at the window's start, ends at the last timestamp (the window's end without one, or when it
    is <|0.00|>), holds all the text, and the next window starts after this one whole."""
    assert read([TS + 20, 1, 2, EOT]).final(7.5, cut_short=False) == ([(0.0, 0.4, [1, 2])], 7.5)
    assert read([TS + 48, 1, TS + 100, EOT]).final(7.5, cut_short=False) == (
        [(0.0, 2.0, [1])],
        7.5,
    )
    assert read([TS + 48, 1, TS + 100]).final(7.5, cut_short=True) == ([(0.0, 2.0, [1])], 7.5)
    assert read([TS, 1, 2, EOT]).final(7.5, cut_short=False) == ([(0.0, 7.5, [1, 2])], 7.5)
    assert read([1, 2, EOT]).final(7.5, cut_short=False) == ([(0.0, 7.5, [1, 2])], 7.5)
    assert read([TS, EOT]).final(7.5, cut_short=False) == ([], 7.5)
    assert read([TS, 1, TS]).final(7.5, cut_short=False)[1] == 7.5  # never stuck at 0.0


def test_a_pair_with_nothing_closed_keeps_the_unfinished_text_as_one_segment():
    assert read([TS, TS, 1, 2, EOT]).final(7.5, cut_short=False) == ([(0.0, 7.5, [1, 2])], 7.5)


def test_a_closed_segment_is_confirmed_only_by_the_pair_after_it():
    """While streaming, a segment closed by a single timestamp may still become part of the
    window's one segment (no pair follows before <|endoftext|>): only a pair confirms it."""
    assert read([TS + 48, 1, TS + 100]).confirmed == 0
    assert read([TS + 48, 1, TS + 100, TS + 100]).confirmed == 1
    assert read([TS + 48, 1, TS + 100, TS + 100, 2, TS + 150]).confirmed == 1


def test_readings_of_partial_output_only_grow():
    tokens = [TS, 1, 2, TS + 156, TS + 172, 3, TS + 336, EOT]
    closed = [read(tokens[:end]).closed for end in range(len(tokens) + 1)]
    assert all(after[: len(before)] == before for before, after in itertools.pairwise(closed))


# decode_seeking: what openai-whisper's transcribe() keeps of a window's segments.
A, B, C, D, E, F = 100, 101, 102, 103, 104, 105  # text tokens


def t(seconds: float) -> int:
    return TS + round(seconds / 0.02)


class Outcome:
    silent, temperature = False, 0.0

    @staticmethod
    def fields() -> dict:
        return {}


def seek_through(samples, outputs: list[list[int]], align=None) -> tuple[list, list]:
    """decode_seeking over scripted window outputs: (segments, each window's previous text)."""
    import asyncio

    from lora_serving.jobs import GenerationChunk
    from lora_serving.tasks.whisper_windows import decode_seeking

    scripted, prompts, outcomes, segments = iter(outputs), [], [], []

    async def decode_window(window, previous):
        prompts.append(previous)
        outcomes.append(Outcome())
        yield GenerationChunk("", "", next(scripted), [], 0, finish_reason="stop")

    async def run():
        async for _ in decode_seeking(
            samples,
            decode_window=decode_window,
            read=lambda ids: read_window(ids, timestamp_begin=TS, eot=EOT),
            decode=lambda ids: " ".join(f"w{i}" for i in ids),
            separator=" ",
            segments=segments,
            outcomes=outcomes,
            condition_on_previous_text=True,
            initial_prompt=[],
            timestamp_begin=TS,
            align=align,
        ):
            pass

    asyncio.run(run())
    return segments, prompts


def test_an_instantaneous_segment_is_cleared_and_times_are_not_clamped_to_the_window():
    """openai-whisper's transcribe(): a segment whose start equals its end is cleared (no text,
    no tokens in the next window's prompt), and a time past a short window's audio stays as
    the timestamp said it."""
    samples = np.zeros(32 * 16_000, "float32")
    first = [t(0), A, t(1), t(1), B, t(1), t(1), C, t(4), t(4), D]  # D unfinished: seek to 4 s
    second = [t(0), E, t(27), t(27), F, t(29.5), EOT]  # 28 s of audio left; said in full
    segments, prompts = seek_through(samples, [first, second])
    assert [(s["start"], s["end"], s["text"]) for s in segments] == [
        (0.0, 1.0, "w100"),
        (1.0, 4.0, "w102"),
        (4.0, 31.0, "w104"),
        (31.0, 33.5, "w105"),  # beyond the recording's 32 s, as openai-whisper reports it
    ]
    assert prompts == [[], [t(0), A, t(1), t(1), C, t(4)]]  # B is not in the prompt


def test_with_words_the_times_the_words_gave_decide_and_the_refinement_does_not():
    """A segment the words made instantaneous is cleared; one only the refinement (VAD) made
    so, or moved, is kept with its refined times."""
    samples = np.zeros(10 * 16_000, "float32")

    async def align(window, timed, offset_s):
        a, c = timed
        a["aligned"], a["start"], a["end"] = (0.5, 0.5), 0.4, 0.6  # instantaneous by the words
        c["aligned"], c["start"], c["end"] = (1.0, 2.0), 1.5, 1.5  # the refinement's
        for segment in timed:
            segment["words"] = [{"word": "x", "start": segment["start"], "end": segment["end"]}]
        return None

    output = [t(0), A, t(1), t(1), C, t(2), EOT]
    segments, _ = seek_through(samples, [output], align)
    assert [(s["start"], s["end"], s["text"]) for s in segments] == [(1.5, 1.5, "w102")]
