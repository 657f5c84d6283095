"""The live-transcription bench without a server: chunk timing, cutting spans, which turn belongs
to which sentence, a session's latencies and retractions, and the report and plot of a results
dict (lora_tools.bench.realtime_report)."""

import json

import pytest

from lora_tools.bench import realtime_latency
from lora_tools.bench import realtime_report as rr

SPANS = [(0.5, 2.5), (4.0, 6.0), (7.5, 9.5)]


def turn(start, end, completed_at, text, deltas=()):
    return {
        "start_s": start,
        "end_s": end,
        "completed_at": completed_at,
        "text": text,
        "deltas": [list(d) for d in deltas],
    }


def test_a_sample_is_sent_when_the_chunk_after_it_is_due():
    assert rr.chunk_sent_at(0.0) == pytest.approx(0.04)
    assert rr.chunk_sent_at(0.039) == pytest.approx(0.04)
    assert rr.chunk_sent_at(0.04) == pytest.approx(0.08)
    assert rr.chunk_sent_at(2.5) == pytest.approx(2.52)


def test_byte_range_holds_the_span_with_its_last_sample():
    assert rr.byte_range((1.0, 2.0), 24000) == (48000, 2 * 48001)
    pcm = bytes(range(256)) * 1000
    begin, end = rr.byte_range((0.001, 0.002), 24000)
    assert len(pcm[begin:end]) == 2 * 25 and begin % 2 == 0


def test_each_sentence_with_a_turn_of_its_own_is_matched():
    turns = [(0.2, 3.0), (3.7, 6.5), (7.2, 10.0)]
    assert rr.match_turns(turns, SPANS) == {0: 0, 1: 1, 2: 2}


def test_merged_and_split_sentences_are_left_out():
    merged = [(0.2, 6.5), (7.2, 10.0)]  # the first two sentences in one turn
    assert rr.match_turns(merged, SPANS) == {2: 1}
    split = [(0.2, 1.5), (1.6, 3.0), (3.7, 6.5), (7.2, 10.0)]  # the first sentence in two
    assert rr.match_turns(split, SPANS) == {1: 2, 2: 3}
    noise = [(0.2, 3.0), (3.1, 3.3), (3.7, 6.5), (7.2, 10.0)]  # a turn of no sentence
    assert rr.match_turns(noise, SPANS) == {0: 0, 1: 2, 2: 3}


def test_session_latencies_from_its_turns():
    turns = [
        turn(0.2, 3.0, 4.52, "One.", [(1.52, "One"), (4.52, ".")]),
        turn(3.7, 6.5, 7.04, "Two.", [(7.04, "Two.")]),  # only the final delta: no partial
        turn(7.2, 10.0, 11.52, "Three.", [(8.52, "Thr"), (11.52, "ee!")]),  # retracted
    ]
    found = rr.session_numbers(turns, SPANS)
    assert found["one_turn_per_sentence"] and found["turns"] == 3
    assert found["end_to_completed"] == pytest.approx([2.0, 1.0, 2.0])
    assert found["speech_to_first_delta"] == pytest.approx([1.0, 1.0])
    assert found["retracted"] == 1
    assert found["texts"] == ["One.", "Two.", "Three."]
    assert found["turn_spans"] == [[0.2, 3.0], [3.7, 6.5], [7.2, 10.0]]


def test_a_merged_turn_counts_as_a_turn_but_gives_no_latency():
    turns = [turn(0.2, 6.5, 7.0, "One two."), turn(7.2, 10.0, 11.52, "Three.")]
    found = rr.session_numbers(turns, SPANS)
    assert not found["one_turn_per_sentence"]
    assert found["turns"] == 2 and found["end_to_completed"] == pytest.approx([2.0])


def test_a_level_merges_its_sessions():
    one = rr.session_numbers([turn(0.2, 3.0, 3.52, "One.")], SPANS[:1])
    two = rr.session_numbers([turn(0.2, 3.0, 5.52, "Uno.", [(6, "x")])], SPANS[:1])
    level = rr.summarise_level(rr.merge_sessions([one, two]))
    assert level["turns"] == 2 and level["sentences"] == 2 and level["retracted"] == 1
    assert level["end_to_completed_s"] == pytest.approx({"p50": 2.0, "p90": 2.8})
    assert level["speech_to_first_delta_s"] is None
    assert level["texts"] == [["One."], ["Uno."]]


def results() -> dict:
    level = rr.summarise_level(
        rr.merge_sessions([rr.session_numbers([turn(0.2, 3.0, 3.52, "One.")], SPANS[:1])])
    )
    return {
        "config": {
            "model": "whisper_lora/alpha",
            "sentences": 1,
            "pause_s": 1.2,
            "audio_s": 4.0,
            "chunk_ms": 40,
            "silence_ms": 500,
        },
        "levels": {"1": level, "4": {**level, "one_turn_per_sentence": False}},
        "wer": {
            "live": {"wer": 0.025, "word_errors": 3, "reference_words": 120},
            "file": {"wer": 0.0333, "word_errors": 4, "reference_words": 120},
        },
        "own_audio": {"exact": 1, "of": 1, "texts": ["One."]},
        "peer": {"seconds": [0.4, 0.6], "latency": {"p50": 0.5, "p90": 0.58}},
        "plot": "latency.png",
    }


def test_report_has_a_row_per_level_the_wer_and_the_peer():
    text = rr.render(json.loads(json.dumps(results())))  # as read back from results.json
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[1:] == [
        "| 1 | 1/1 | yes | 1.00 s / 1.00 s | - | 0 |",
        "| 4 | 1/1 | NO | 1.00 s / 1.00 s | - | 0 |",
    ]
    assert "live (completed turns joined) 2.50 % (3/120 words)" in text
    assert "3.33 % (4/120): -0.83 points, within 1 point" in text
    assert "of their own audio (cut at the turn's VAD events, uploaded" in text
    assert "/v1/audio/transcriptions): 1/1" in text
    assert "upload -> text 0.50 s / 0.58 s" in text
    assert "end of speech -> completed 1.00 s / 1.00 s" in text
    assert "![latency vs sessions](latency.png)" in text


def test_a_wer_gap_over_the_bar_is_said():
    gap = {
        "live": {"wer": 0.05, "word_errors": 6, "reference_words": 120},
        "file": {"wer": 0.025, "word_errors": 3, "reference_words": 120},
    }
    assert "+2.50 points, NOT within 1 point" in rr.wer_line(gap)


def test_plot_is_written(tmp_path):
    rr.plot(results(), tmp_path / "latency.png")
    assert (tmp_path / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_recording_is_about_a_minute_of_distinct_sentences():
    assert len(realtime_latency.SENTENCES) == 15
    assert len(set(realtime_latency.SENTENCES)) == 15
    minimum = realtime_latency.LEAD_S + 15 * (2.0 + realtime_latency.PAUSE_S)
    assert minimum > 48  # each espeak-ng sentence is >2 s: the whole is ~60 s (59 s measured)


def test_a_turn_is_cut_at_its_event_milliseconds():
    # audio_start_ms 1234, audio_end_ms 3500 at 24 kHz: samples 29616..84000
    assert rr.turn_byte_range((1.234, 3.5), 24000) == (2 * 29616, 2 * 84000)
    assert rr.turn_byte_range((0.0, 0.001), 16000) == (0, 32)


def test_padding_widens_the_cut_but_not_before_the_start():
    assert rr.byte_range((1.0, 2.0), 100, 0.3, 0.5) == (140, 2 * 251)
    assert rr.byte_range((0.1, 2.0), 100, 0.3, 0.0) == (0, 2 * 201)


def test_live_turns_against_the_uploads_exactly_and_after_the_normaliser():
    same = rr.same_texts(
        ["The old bridge.", "Three hours.", "A dog"], ["the old bridge", "3 hours.", "A cat"]
    )
    assert same == {"exact": 0, "same_words": 2, "of": 3}
    line = rr.peer_line(
        {"seconds": [1], "latency": {"p50": 1, "p90": 1}, "same_as_live": same}, None
    )
    assert line.endswith("as their sentence's upload: 0/3 exactly, 2/3 after the normaliser")
