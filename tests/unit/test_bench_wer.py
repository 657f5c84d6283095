"""The word-error-rate part of the bench without a server or faster-whisper: the settings sent to
each side, the sentences, scoring, the report's section and plot, and the bench's imports."""

import sys
from pathlib import Path

import numpy as np
import pytest

from lora_tools.bench import wer
from lora_tools.bench.config import BenchConfig, load_config
from lora_tools.bench.report import (
    beam_throughput_ratio,
    render_markdown,
    wer_rows,
    wer_section,
)
from tests.unit.test_import_boundary import imported_modules

BENCH = Path(wer.__file__).parent


# ---- settings ----------------------------------------------------------------------------------
def test_defaults_send_nothing_and_faster_whisper_gets_the_same_decoding():
    defaults, beam5, beam5_transformers = wer.SETTINGS
    assert defaults.ours() == {} and beam5.ours() == {"beam_size": 5}
    assert beam5_transformers.ours() == {"beam_size": 5, "beam_rule": "transformers"}
    expected = {
        "language": "en",
        "beam_size": 1,
        "best_of": 1,
        "patience": 1.0,
        "length_penalty": 1.0,
        "temperature": [0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
        "compression_ratio_threshold": 2.4,
        "log_prob_threshold": -1.0,
        "no_speech_threshold": 0.6,
        "condition_on_previous_text": True,
        "suppress_tokens": [-1],
        "suppress_blank": True,
        "without_timestamps": True,
        "vad_filter": False,
    }
    assert defaults.faster_whisper() == expected
    assert beam5.faster_whisper() == beam5_transformers.faster_whisper()
    assert beam5.faster_whisper() == expected | {"beam_size": 5}


def test_sentences_are_fixed_and_spoken_by_several_voices_and_speeds():
    first, again = wer.utterances(), wer.utterances()
    assert first == again and 20 <= len(first) <= 30
    assert len({u.text for u in first}) == len(first)
    assert len({u.voice for u in first}) >= 4 and len({u.speed for u in first}) >= 3


# ---- scoring -----------------------------------------------------------------------------------
def test_side_result_scores_after_whispers_normaliser():
    result = wer.side_result(
        ["Hello, World!", "The cat sat."], ["hello world", "the cat sat on"], [0.5, 1.5]
    )
    assert result["errors"] == [0, 1]
    assert (result["word_errors"], result["reference_words"]) == (1, 5)
    assert result["wer"] == pytest.approx(0.2) and result["total_s"] == pytest.approx(2.0)


# ---- report ------------------------------------------------------------------------------------
def _side(wer_value, errors, total_s, texts=("a b", "c")):
    return {
        "texts": list(texts),
        "errors": errors,
        "seconds": [total_s / 2] * 2,
        "total_s": total_s,
        "word_errors": sum(errors),
        "reference_words": 3,
        "wer": wer_value,
        "other_load": 0.5,
    }


def _wer_results():
    settings = {}
    for setting in wer.SETTINGS:
        settings[setting.name] = {
            "label": setting.label,
            "ours_parameters": setting.ours(),
            "faster_whisper_arguments": setting.faster_whisper(),
        }
    settings["defaults"] |= {
        "ours": _side(0.0, [0, 0], 4.0),
        "faster_whisper": _side(1 / 3, [0, 1], 2.0, texts=("a b", "see")),
    }
    settings["beam5"] |= {
        "ours": _side(1 / 3, [1, 0], 10.0, texts=("a", "c")),
        "faster_whisper": _side(0.0, [0, 0], 4.0),
    }
    return {"sentences": ["A b.", "C."], "audio_s": 3.0, "threads": 1, "settings": settings}


def test_wer_rows_and_beam_throughput():
    rows = wer_rows(_wer_results())
    assert [r["setting"] for r in rows] == ["defaults", "beam5"]
    assert rows[0]["ours_errors"] == 0 and rows[0]["faster_whisper_errors"] == 1
    assert beam_throughput_ratio(rows, "ours") == pytest.approx(0.4)
    assert beam_throughput_ratio(rows, "faster_whisper") == pytest.approx(0.5)
    assert wer_rows({"settings": {"defaults": {"label": "x", "ours": _side(0, [0], 1)}}}) == []


def test_wer_section_puts_each_figure_next_to_faster_whisper():
    text = "\n".join(wer_section(_wer_results(), "/x/wer_vs_faster_whisper.png"))
    assert (
        "| defaults (greedy + temperature fallback) | 0.000 (0/3) | 0.333 (1/3) | 4.0 | 2.0 | yes |"
        in text
    )
    assert "| beam 5 | 0.333 (1/3) | 0.000 (0/3) | 10.0 | 4.0 | **no** |" in text
    assert "whisper_lora 0.40, faster-whisper 0.50" in text
    assert "whisper_lora's runs 0.50, faster-whisper's runs 0.50" in text
    assert "none (its model.json defaults)" in text and '`{"beam_size": 5}`' in text
    assert "best_of=1" in text and "without_timestamps=True" in text
    assert "- beam5: “A b.”\n  - whisper_lora (1 errors): “a”" in text
    assert "  - faster-whisper (1 errors): “see”" in text
    assert text.endswith("![wer_vs_faster_whisper](wer_vs_faster_whisper.png)")


def test_wer_section_shows_a_failure():
    lines = wer_section({"error": "Traceback ...\nRuntimeError: no server"})
    assert "RuntimeError: no server" in "\n".join(lines)


def test_report_of_a_wer_only_run(tmp_path):
    pytest.importorskip("matplotlib")
    from lora_tools.bench.report import write_report

    config = load_config(None, {"models": ["wer"]})
    results = {"models": {}, "wer": _wer_results(), "total_s": 60.0}
    text = write_report(results, config, tmp_path).read_text()
    assert "## Word error rate vs faster-whisper" in text and "Ratios against" not in text
    assert (tmp_path / "wer_vs_faster_whisper.png").stat().st_size > 1000
    assert text.count("wer_vs_faster_whisper.png") == 1  # in its section, not again under Plots
    assert "Word error rate" not in render_markdown({"models": {}}, config, [])


def test_wer_is_a_part_of_every_run_by_default():
    assert BenchConfig().models == ["whisper", "qwen_vl", "wer", "speed", "words"]


# ---- imports -----------------------------------------------------------------------------------
def test_bench_modules_import_each_other_without_a_circle():
    modules = {f"lora_tools.bench.{p.stem}": p for p in BENCH.glob("*.py")}
    graph = {name: imported_modules(path) & set(modules) for name, path in modules.items()}

    def reaches(start: str, target: str, seen: set) -> bool:
        for nxt in graph[start] - seen:
            seen.add(nxt)
            if nxt == target or reaches(nxt, target, seen):
                return True
        return False

    circles = [name for name in graph if reaches(name, name, set())]
    assert circles == []


def test_faster_whisper_script_needs_only_the_standard_library_and_faster_whisper():
    top = {name.split(".")[0] for name in imported_modules(wer.PEER_SCRIPT)}
    assert top - set(sys.stdlib_module_names) == {"faster_whisper"}


def test_word_timing_scores_starts_against_the_truth():
    from lora_tools.bench.word_gaps import GapClip, TimedWord
    from lora_tools.bench.word_timing import _entry, report_lines, start_errors

    clip = GapClip(
        np.zeros(16_000, np.float32),
        (TimedWord("apple", 0.5, 0.9), TimedWord("river", 1.5, 2.0)),
    )
    words = [{"word": " Apple.", "start": 0.4}, {"word": " river", "start": 1.0}]
    assert start_errors(words, clip) == pytest.approx([-0.1, -0.5])
    assert _entry(words, clip)["mean_abs_start_error"] == pytest.approx(0.3)
    assert start_errors(words[:1], clip) is None  # a word missing: no score
    repeated = [*words, {"word": " Apple", "start": 1.9}]  # a repeat in the trailing silence
    assert start_errors(repeated, clip) == pytest.approx([-0.1, -0.5])
    assert _entry(repeated, clip)["extra_words"] == 1
    lines = report_lines(
        {
            "truth": [{}, {}],
            "files": 3,
            "audio_s": 9.0,
            "ours_refined": _entry(words, clip),
            "ours_exact": {"mean_abs_start_error": 0.8},
            "faster_whisper": {"mean_abs_start_error": None},
            "throughput_ratio": 0.93,
        }
    )
    text = "\n".join(lines)
    assert "| whisper_lora, refined (default) | 0.300 |" in text
    assert "words differ" in text and "**0.930**" in text
