"""openai-whisper's word-timing steps (tasks/whisper_words) and our refinement
(tasks/whisper_word_refine), on hand-made cases with known answers."""

import numpy as np
import pytest
import torch

from lora_serving.tasks import whisper_word_refine, whisper_words
from lora_serving.tasks.whisper_words import WordTiming
from lora_serving.vllm_plugin import whisper_alignment


def dtw_by_loops(x: np.ndarray):
    """openai-whisper's dtw_cpu + backtrace written as its loops (timing.py), for comparison."""
    n, m = x.shape
    cost = np.ones((n + 1, m + 1), dtype=np.float32) * np.inf
    trace = -np.ones((n + 1, m + 1), dtype=np.float32)
    cost[0, 0] = 0
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i, j] = x[i - 1, j - 1] + c
            trace[i, j] = t
    return whisper_words.backtrace(trace.astype(np.int8))


def test_dtw_follows_the_cheap_cells():
    x = np.ones((3, 6))
    x[0, 0:2] = x[1, 2:4] = x[2, 4:6] = -1.0
    text, time = whisper_words.dtw(x)
    assert text.tolist() == [0, 0, 1, 1, 2, 2]
    assert time.tolist() == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("seed", range(5))
def test_dtw_equals_openai_whispers_loops_ties_included(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((7, 23))
    if seed % 2:
        x = np.round(x)  # many equal costs: the tie-breaking decides the path
    for got, want in zip(whisper_words.dtw(x), dtw_by_loops(x), strict=True):
        assert got.tolist() == want.tolist()


def test_median_filter_reflects_at_the_edges():
    x = torch.tensor([1.0, 5.0, 2.0, 8.0, 3.0])
    assert whisper_alignment.median_filter(x, 3).tolist() == [5.0, 2.0, 5.0, 3.0, 8.0]
    assert whisper_alignment.median_filter(x[:1], 3).tolist() == [1.0]  # too short: unchanged


def test_alignment_matrix_drops_the_sot_and_eot_rows():
    weights = torch.randn(2, 8, 20)  # 2 heads, sot (3) + notimestamps + 3 text + eot, 20 frames
    matrix = whisper_alignment.alignment_matrix(weights, text_from=3)
    assert matrix.shape == (4, 20)


def test_text_token_probabilities_are_among_text_tokens_only():
    eot = 4
    embedding = torch.eye(6)  # logits = hidden rows
    prompt = [5, 4, 1, 2, eot]  # sot(1) + notimestamps stand-in + text [1, 2] + eot
    hidden = torch.zeros(5, 6)
    hidden[1, 1] = 10.0  # after notimestamps, text token 1 is likely
    hidden[1, 5] = 50.0  # a special token's logit does not count
    probabilities = whisper_alignment.text_token_probabilities(
        hidden, embedding, prompt, text_from=1, eot=eot
    )
    assert probabilities[0] == pytest.approx(np.exp(10) / (np.exp(10) + 3))
    assert probabilities[1] == pytest.approx(0.25)


PIECES = {1: b" Hel", 2: b"lo", 3: b",", 4: b" world", 5: b"<|endoftext|>"}
PIECES |= {6: "你".encode()[:2], 7: "你".encode()[2:], 8: "好".encode()}


def decode(tokens):
    return b"".join(PIECES[t] for t in tokens).decode("utf-8", errors="replace")


def test_words_split_at_spaces_and_punctuation():
    words, tokens = whisper_words.split_to_word_tokens(
        [1, 2, 3, 4, 5], decode, eot=5, language="en"
    )
    assert words == [" Hello", ",", " world", "<|endoftext|>"]
    assert tokens == [[1, 2], [3], [4], [5]]


def test_words_split_at_whole_characters_for_chinese():
    words, tokens = whisper_words.split_to_word_tokens([6, 7, 8], decode, eot=5, language="zh")
    assert words == ["你", "好"]
    assert tokens == [[6, 7], [8]]


def test_word_timings_from_the_path_jumps():
    matrix = -np.ones((3, 6))  # rows: <|notimestamps|>, two text tokens
    matrix[0, 0:2] = matrix[1, 2:4] = matrix[2, 4:6] = 1.0
    timings = whisper_words.word_timings(
        matrix,
        [0.5, 0.7],
        [4, 1],
        lambda tokens: whisper_words.split_to_word_tokens(tokens, decode, eot=5, language="en"),
        eot=5,
    )
    assert [(t.word, t.start, t.end, t.probability) for t in timings] == [
        (" world", 0.0, 0.04, 0.5),
        (" Hel", 0.04, 0.08, 0.7),
    ]


def timing(word, start, end, tokens=None):
    return WordTiming(word, tokens or [len(word)], start, end, 0.9)


def test_merge_punctuations_joins_the_neighbouring_words():
    alignment = [timing(" (", 0, 0), timing("Hello", 0, 1), timing(")", 1, 1)]
    alignment += [timing(" world", 1, 2), timing("!", 2, 2)]
    whisper_words.merge_punctuations(
        alignment, whisper_words.PREPEND_PUNCTUATIONS, whisper_words.APPEND_PUNCTUATIONS
    )
    assert [t.word for t in alignment] == ["", " (Hello)", "", " world!", ""]


def test_a_long_word_after_a_sentence_end_is_clamped():
    alignment = [timing(" a", 0.0, 0.2), timing(".", 0.2, 0.4), timing(" b", 0.4, 2.0)]
    alignment.append(timing(" c", 2.0, 2.2))
    segment = {"start": 0.0, "end": 2.2, "tokens": [1, 2, 3, 4]}
    whisper_words.add_word_timestamps(
        [segment], alignment, time_offset=0.0, last_speech_timestamp=0.0
    )
    assert [(w["word"], w["start"], w["end"]) for w in segment["words"]] == [
        (" a.", 0.0, 0.2),
        (" b", 1.6, 2.0),  # twice the median duration (0.2 s) at most
        (" c", 2.0, 2.2),
    ]


def test_a_last_word_past_the_segment_end_stops_there():
    alignment = [timing(" a", 0.0, 0.2), timing(" b", 0.2, 0.4), timing(" c", 0.4, 2.4)]
    segment = {"start": 10.0, "end": 11.0, "tokens": [1, 2, 3]}
    whisper_words.add_word_timestamps(
        [segment], alignment, time_offset=10.0, last_speech_timestamp=10.0
    )
    assert [(w["start"], w["end"]) for w in segment["words"]] == [
        (10.0, 10.2),
        (10.2, 10.4),
        (10.4, 11.0),
    ]
    assert (segment["start"], segment["end"]) == (10.0, 11.0)


def test_segment_times_follow_the_words_and_the_last_word_end_is_kept():
    alignment = [timing(" a", 0.3, 0.5), timing(" b", 0.5, 0.9)]
    segments = [
        {"start": 0.0, "end": 1.0, "tokens": [1]},
        {"start": 1.0, "end": 1.0, "tokens": [2]},
    ]
    whisper_words.add_word_timestamps(
        segments, alignment, time_offset=2.0, last_speech_timestamp=0.0
    )
    assert (segments[0]["start"], segments[0]["end"]) == (2.3, 2.5)
    assert whisper_words.last_word_end(segments) == 2.9


def test_refine_trims_silence_a_word_absorbed():
    # "river" after a pause: DTW gives it the pause; the previous word's padded tail overlaps.
    words = [
        {"word": " apple", "start": 0.48, "end": 0.88},
        {"word": " river", "start": 0.88, "end": 1.96},
    ]
    segment = {"start": 0.48, "end": 1.96, "words": words}
    whisper_word_refine.refine([segment], [(0.482, 0.99), (1.474, 2.11)])
    assert [(w["start"], w["end"]) for w in words] == [(0.48, 0.88), (1.47, 1.96)]
    assert (segment["start"], segment["end"]) == (0.48, 1.96)


def test_refine_keeps_words_inside_continuous_speech_and_words_without_speech():
    words = [{"word": " a", "start": 1.0, "end": 1.2}, {"word": " b", "start": 5.0, "end": 5.5}]
    whisper_word_refine.refine([{"start": 1.0, "end": 5.5, "words": words}], [(0.5, 3.0)])
    assert [(w["start"], w["end"]) for w in words] == [(1.0, 1.2), (5.0, 5.5)]


def test_refine_trims_a_word_ending_in_silence():
    words = [{"word": " end.", "start": 2.0, "end": 3.5}]
    whisper_word_refine.refine([{"start": 2.0, "end": 3.5, "words": words}], [(1.9, 2.6)])
    assert (words[0]["start"], words[0]["end"]) == (2.0, 2.6)


def test_the_engine_keeps_untaken_alignments_within_its_budget(monkeypatch):
    from lora_serving.vllm_plugin import whisper_alignment

    monkeypatch.setattr(whisper_alignment, "MAX_RESULT_BYTES", 10)
    store = whisper_alignment.AlignmentStore()
    for key in "abc":
        store.put(key, {"matrix": b"12345", "shape": [1, 1], "probabilities": []})
    assert list(store.results) == ["b", "c"]  # the oldest, never taken, is dropped
    assert store.take("c")["matrix"] == b"12345"
    assert "error" in store.take("c")  # taken once
    assert "enforce_eager" in store.take("a")["error"]


def test_an_alignment_flag_names_the_heads_by_layer():
    from lora_serving.vllm_plugin.whisper_alignment import AlignmentSpec

    spec = AlignmentSpec.from_extra_arg(
        {
            "key": "w-0-words",
            "heads": [[3, 1], [4, 2], [4, 7]],
            "frames": 100,
            "text_from": 3,
            "eot": 9,
        }
    )
    assert spec.heads == {3: [1], 4: [2, 7]} and spec.frames == 100
