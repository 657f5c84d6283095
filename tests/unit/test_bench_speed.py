"""P7 (whisper_lora ÷ faster-whisper throughput) without a server or faster-whisper: the
sentences and the long recording, the settings each side gets, scoring, ratios and the report."""

import math

import numpy as np
import pytest

from lora_tools.bench import speed_report, wer, whisper_speed
from lora_tools.bench.config import load_config
from lora_tools.bench.report import all_ratios, render_markdown


def test_at_least_50_sentences_the_first_ones_the_wer_parts():
    sentences = whisper_speed.SENTENCES
    assert len(sentences) >= 50 and len(set(sentences)) == len(sentences)
    assert sentences[: len(wer.SENTENCES)] == wer.SENTENCES


def test_clips_are_joined_with_silence_between_them():
    a, b = np.full(3, 0.5, np.float32), np.full(2, -0.5, np.float32)
    joined = whisper_speed.join_clips([a, b], gap_s=2 / wer.SAMPLE_RATE)
    assert joined.tolist() == [0.5, 0.5, 0.5, 0.0, 0.0, -0.5, -0.5]


def test_our_windows_become_faster_whispers_clip_timestamps_in_seconds():
    stamps = whisper_speed.clip_timestamps([0.0, 29.5], [472_000, 160_000])
    assert stamps == [{"start": 0.0, "end": 29.5}, {"start": 29.5, "end": 39.5}]


def test_both_sides_decode_with_the_wer_parts_defaults():
    assert whisper_speed.DEFAULTS.name == "defaults" and whisper_speed.DEFAULTS.ours() == {}
    assert whisper_speed.DEFAULTS.faster_whisper()["vad_filter"] is False
    assert whisper_speed.PEER_TYPES[0] == speed_report.PEER == "int8"


def test_side_entry_rates_and_word_errors():
    entry = whisper_speed.side_entry(
        12.0, [2.0, 4.0], ["the cat sat", "a dog"], ["The cat sat.", "a frog"]
    )
    assert entry["rates"] == [6.0, 3.0]
    assert (entry["word_errors"], entry["reference_words"]) == (1, 5)
    assert entry["wer"] == pytest.approx(0.2)


def _side(clips: list[float], long: list[float], wer_value: float = 0.1) -> dict:
    return {
        "clips": {"rates": clips, "wer": wer_value, "word_errors": 5, "reference_words": 50},
        "long": {"rates": long, "wer": wer_value, "word_errors": 6, "reference_words": 50},
        "other_load": 0.01,
    }


def _speed() -> dict:
    return {
        "sentences": ["x"] * 54,
        "clips_audio_s": 150.0,
        "long_audio_s": 177.0,
        "long_windows": 6,
        "concurrency": 4,
        "threads": 2,
        "repeats": 2,
        "ours": {
            "float32": _side([6.0, 8.0], [10.0, 12.0]),
            "bfloat16": _side([9.0, 8.0], [15.0, 12.0]),
        },
        "faster_whisper": {
            "int8": _side([3.0, 4.0], [10.0, 10.0]),
            "float32": _side([2.0, 2.0], [5.0, 5.0]),
        },
    }


def test_p7_is_each_dtype_over_faster_whisper_int8_paired_by_round():
    ratios = {r.name: r for r in speed_report.p7_ratios(_speed())}
    assert set(ratios) == {
        "P7 whisper_lora clips",
        "P7 whisper_lora long",
        "P7 whisper_lora clips (bfloat16)",
        "P7 whisper_lora long (bfloat16)",
    }
    assert ratios["P7 whisper_lora clips"].per_repeat == (2.0, 2.0)
    assert ratios["P7 whisper_lora clips"].met
    assert ratios["P7 whisper_lora long"].per_repeat == (1.0, 1.2)
    assert not ratios["P7 whisper_lora long"].met
    assert ratios["P7 whisper_lora long (bfloat16)"].per_repeat == (1.5, 1.2)
    assert speed_report.dtype_ratios(_speed()) == {"bfloat16": {"clips": 1.25, "long": 1.25}}


def test_section_puts_every_side_in_one_table_with_its_word_error_rate():
    text = "\n".join(speed_report.section(_speed(), "out/speed_vs_faster_whisper.png"))
    assert "| whisper_lora float32 | 7.00 | 0.100 (5/50) | 11.00 | 0.100 (6/50) |" in text
    assert "| faster-whisper int8 | 3.50 | 0.100 (5/50) | 10.00 | 0.100 (6/50) |" in text
    assert "- P7 whisper_lora long: 1.10 (rounds 1.00 – 1.20) **missed**" in text
    assert "- whisper_lora bfloat16 ÷ float32: clips 1.25, long 1.25" in text
    assert text.endswith("![speed_vs_faster_whisper](speed_vs_faster_whisper.png)")
    failed = speed_report.section({"error": "Traceback\nRuntimeError: no server"})
    assert "RuntimeError: no server" in "\n".join(failed)


def test_report_of_a_speed_only_run(tmp_path):
    from lora_tools.bench.report import write_report

    config = load_config(None, {"models": ["speed"]})
    results = {"models": {}, "speed": _speed(), "total_s": 60.0}
    assert [r.name for r in all_ratios(results, config)][:2] == [
        "P7 whisper_lora clips",
        "P7 whisper_lora clips (bfloat16)",
    ]
    text = write_report(results, config, tmp_path).read_text()
    assert "## Speed vs faster-whisper (P7)" in text
    assert (tmp_path / "speed_vs_faster_whisper.png").stat().st_size > 1000
    assert text.count("speed_vs_faster_whisper.png") == 1
    assert "Speed vs faster-whisper" not in render_markdown({"models": {}}, config, [])
    assert math.isnan(speed_report.side_rows({"ours": {"float32": {}}})[0]["clips_rate"])
