"""The word-timing line of the bench (`make bench BENCH_ARGS="--models words"`).

Accuracy: on espeak-ng words joined by 0.6-1.4 s silences (lora_tools.bench.word_gaps, word
times known to the sample), the mean |Δ| of word starts against the truth for whisper_lora with
`word_timestamps_refine` on (the default) and off (openai-whisper's timings) and for
faster-whisper's `word_timestamps=True` on the same whisper-base weights (CTranslate2, float32,
its own environment). Cost: whisper_lora's throughput over the word-error-rate sentences with
word timings ÷ without (segment timestamps both ways; goal >= 0.90).
"""

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from lora_tools.bench import wer
from lora_tools.bench.word_gaps import GapClip, bare, gap_clip


def start_errors(words: list[dict], clip: GapClip) -> list[float] | None:
    """Each true word's start error (seconds): the transcript's first words must be the true
    ones (words after them, e.g. a hallucinated repeat in the trailing silence, are counted
    apart: `extra_words`); None when they are not."""
    said = [bare(w["word"]) for w in words[: len(clip.words)]]
    if said != [t.word for t in clip.words]:
        return None
    return [w["start"] - t.start for w, t in zip(words, clip.words, strict=False)]


def _served_words(url: str, model: str, path: Path, options: dict) -> list[dict]:
    from lora_client.requests import send, transcription_fields

    fields = transcription_fields(path, language="en", timestamps=True, decoding=options)
    replies = list(send(url, "grpc", model, fields))
    segments = json.loads(replies[-1].outputs["segments"][0])
    return [word for segment in segments for word in segment.get("words", ())]


def _served_round(url: str, model: str, files: list[Path], options: dict, concurrency: int):
    """Seconds to transcribe every file, `concurrency` at a time, with timestamps."""
    from lora_client.requests import send, transcription_fields

    def one(path: Path) -> None:
        fields = transcription_fields(path, language="en", timestamps=True, decoding=options)
        list(send(url, "grpc", model, fields))

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, files))
    return time.perf_counter() - started


def _entry(words: list[dict], clip: GapClip) -> dict:
    errors = start_errors(words, clip)
    return {
        "words": [bare(w["word"]) for w in words],
        "starts": [w["start"] for w in words],
        "start_errors": errors,
        "extra_words": max(len(words) - len(clip.words), 0),
        "mean_abs_start_error": None if errors is None else float(np.mean(np.abs(errors))),
    }


def measure(config, out: Path, log, meter) -> dict:
    from lora_serving.launcher import REPO_ROOT
    from lora_tools.bench import peer_env
    from lora_tools.bench.repository import build_served_only

    work = config.results_dir / "work"
    clip = gap_clip()
    clip_path = work / "word-gaps.wav"
    clip_path.parent.mkdir(parents=True, exist_ok=True)
    clip_path.write_bytes(clip.wav())
    files, audio_s = wer.speech_files(work / "wer-speech")
    result: dict = {
        "truth": [{"word": t.word, "start": t.start, "end": t.end} for t in clip.words],
        "audio_s": audio_s,
        "files": len(files),
    }
    repo = work / "repository-words"
    model = build_served_only(config, "whisper", repo)
    threads = wer.peer_threads(config, repo, model)
    server = wer.start_served(repo, model, out, config, log, result, label="words")
    try:
        url = f"127.0.0.1:{server.grpc}"
        for name, refine in (("ours_refined", True), ("ours_exact", False)):
            options = {"word_timestamps": True, "word_timestamps_refine": refine}
            result[name] = _entry(_served_words(url, model, clip_path, options), clip)
        concurrency = config.speed_concurrency
        _served_round(url, model, files[:2], {"word_timestamps": True}, concurrency)  # warm-up
        rounds = {"with_words": [], "without_words": []}
        meter.start()
        for _ in range(config.repeats):
            for name, options in (("without_words", {}), ("with_words", {"word_timestamps": True})):
                rounds[name].append(_served_round(url, model, files, options, concurrency))
        result["other_load"] = meter.stop()
    finally:
        server.stop()
    result["seconds"] = rounds
    result["throughput_ratio"] = float(
        np.median(rounds["without_words"]) / np.median(rounds["with_words"])
    )
    peer_python = peer_env.ensure("faster-whisper", REPO_ROOT / wer.PEER_LOCK, log)
    peer = wer.transcribe_faster_whisper(
        peer_python,
        wer.write_ct2_folder(work / "ct2-whisper-base"),
        [clip_path],
        threads,
        out / "faster-whisper-words-job.json",
        out / "faster-whisper-words.log",
        {"words": wer.SETTINGS[0].faster_whisper() | {"word_timestamps": True}},
    )
    peer_words = [w for s in peer["words"]["segments"][0] for w in s.get("words", ())]
    result["faster_whisper"] = _entry(peer_words, clip)
    for name in ("ours_refined", "ours_exact", "faster_whisper"):
        mean = result[name]["mean_abs_start_error"]
        shown = "words differ" if mean is None else f"{mean:.3f} s"
        log(f"    {name:15s} mean |Δ| of word starts vs truth: {shown}")
    log(f"    throughput with word timings ÷ without: {result['throughput_ratio']:.3f}")
    return result


def report_lines(words: dict) -> list[str]:
    """The report's word-timing section (markdown)."""
    if "error" in words:
        return ["## Word timings", "", "failed: see results.json", ""]

    def cell(name: str) -> str:
        entry = words.get(name, {})
        mean, extra = entry.get("mean_abs_start_error"), entry.get("extra_words", 0)
        shown = "words differ" if mean is None else f"{mean:.3f}"
        return shown + (f" ({extra} extra words after the last)" if extra else "")

    return [
        "## Word timings",
        "",
        f"{len(words['truth'])} espeak-ng words joined by 0.6-1.4 s silences (true times known); "
        f"throughput over {words['files']} sentences ({words['audio_s']:.0f} s of speech), "
        "timestamps on both ways.",
        "",
        "| | mean abs. error of word starts (s) |",
        "|---|---|",
        f"| whisper_lora, refined (default) | {cell('ours_refined')} |",
        f"| whisper_lora, `word_timestamps_refine=false` (openai-whisper's) | "
        f"{cell('ours_exact')} |",
        f"| faster-whisper `word_timestamps=True`, float32 | {cell('faster_whisper')} |",
        "",
        f"Throughput with word timings ÷ without: **{words['throughput_ratio']:.3f}** "
        "(goal >= 0.90).",
        "",
    ]
