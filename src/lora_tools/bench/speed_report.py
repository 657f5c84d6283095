"""The report's part for P7 (bench/whisper_speed.py): results.json's "speed" -> ratios, a
markdown section and a plot. Plain data in, text out (unit-tested), but the plot."""

import math
from pathlib import Path

from lora_tools.bench.stats import Ratio, median, paired_ratios

P7_GOAL = 2.0
P7_TITLE = "whisper_lora ÷ faster-whisper int8, audio seconds per second"
PLOT = "speed_vs_faster_whisper"
WORKLOADS = (("clips", "short clips, one request each"), ("long", "one long recording"))
PEER = "int8"  # the bar: faster-whisper's fastest CPU mode


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _rates(speed: dict, side: str, name: str, workload: str) -> list[float]:
    return list(((speed.get(side) or {}).get(name) or {}).get(workload, {}).get("rates", []))


def p7_ratios(speed: dict) -> list[Ratio]:
    """whisper_lora at each dtype ÷ faster-whisper int8, per workload, paired by round (the
    first dtype measured is P7 itself; the others are named after their dtype)."""
    ratios = []
    for index, dtype in enumerate(speed.get("ours") or {}):
        for workload, _ in WORKLOADS:
            name = f"P7 whisper_lora {workload}" + ("" if index == 0 else f" ({dtype})")
            per_round = paired_ratios(
                _rates(speed, "ours", dtype, workload),
                _rates(speed, "faster_whisper", PEER, workload),
            )
            ratios.append(Ratio(name, per_round, P7_GOAL))
    return ratios


def side_rows(speed: dict) -> list[dict]:
    """One row per side (whisper_lora per dtype, faster-whisper per compute type): median audio
    seconds per second and word error rate of each workload."""
    rows = []
    for side, title in (("ours", "whisper_lora"), ("faster_whisper", "faster-whisper")):
        for name, entry in (speed.get(side) or {}).items():
            row = {"side": f"{title} {name}"}
            for workload, _ in WORKLOADS:
                part = entry.get(workload) or {}
                row[f"{workload}_rate"] = median(part.get("rates", []))
                row[f"{workload}_wer"] = part.get("wer", math.nan)
                row[f"{workload}_errors"] = part.get("word_errors")
                row[f"{workload}_words"] = part.get("reference_words")
            rows.append(row)
    return rows


def dtype_ratios(speed: dict) -> dict[str, dict[str, float]]:
    """Each later dtype ÷ the first, per workload (e.g. bfloat16 ÷ float32), paired by round."""
    dtypes = list(speed.get("ours") or {})
    out = {}
    for dtype in dtypes[1:]:
        out[dtype] = {
            workload: median(
                paired_ratios(
                    _rates(speed, "ours", dtype, workload),
                    _rates(speed, "ours", dtypes[0], workload),
                )
            )
            for workload, _ in WORKLOADS
        }
    return out


def section(speed: dict, plot: str | None = None) -> list[str]:
    out = ["## Speed vs faster-whisper (P7)", ""]
    if "error" in speed:
        return out + ["```", speed["error"][-3000:], "```"]
    dtypes = list(speed.get("ours") or {})
    out.append(
        f"{len(speed.get('sentences', []))} espeak-ng sentences "
        f"({_fmt(speed.get('clips_audio_s', math.nan), 0)} s of speech), the same 16 kHz files "
        "to both sides, language en, plain text, greedy with model.json's decoding defaults on "
        "both (temperature fallback, suppression; no VAD). Short clips: whisper_lora at "
        f"{speed.get('concurrency', '?')} requests in flight through Triton (gRPC) vs "
        "faster-whisper's transcribe() one clip after another. Long: the clips joined into one "
        f"{_fmt(speed.get('long_audio_s', math.nan), 0)} s recording, whisper_lora's one "
        f"request vs faster-whisper's BatchedInferencePipeline (batch 8), both on the same "
        f"{speed.get('long_windows', '?')} windows. faster-whisper: the same CTranslate2 "
        f"whisper-base, {speed.get('threads', '?')} thread(s) (the cores whisper_lora's engine "
        f"is bound to). Rates: audio seconds per wall second, median of {speed.get('repeats')} "
        "rounds."
    )
    out += [
        "",
        "| side | short clips: audio s/s | WER | long recording: audio s/s | WER |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in side_rows(speed):
        cells = []
        for workload, _ in WORKLOADS:
            errors, words = row[f"{workload}_errors"], row[f"{workload}_words"]
            counts = f" ({errors}/{words})" if errors is not None else ""
            cells.append(
                f"{_fmt(row[f'{workload}_rate'])} | {_fmt(row[f'{workload}_wer'], 3)}{counts}"
            )
        out.append(f"| {row['side']} | {' | '.join(cells)} |")
    ratios = p7_ratios(speed)
    if ratios:
        out += ["", f"P7 (goal ≥ {P7_GOAL:g}, whisper_lora ÷ faster-whisper {PEER}):"]
        out += [
            f"- {r.name}: {_fmt(r.value)} (rounds {_fmt(r.spread[0])} – {_fmt(r.spread[1])})"
            + ("" if r.met else " **missed**")
            for r in ratios
        ]
    for dtype, by_workload in dtype_ratios(speed).items():
        out.append(
            f"- whisper_lora {dtype} ÷ {dtypes[0]}: "
            + ", ".join(f"{w} {_fmt(v)}" for w, v in by_workload.items())
        )
    if plot:
        out += ["", f"![{PLOT}]({Path(plot).name})"]
    return out


def write_plot(plt, speed: dict, path: str) -> None:
    rows = side_rows(speed)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, (workload, title) in zip(axes, WORKLOADS, strict=True):
        values = [row[f"{workload}_rate"] for row in rows]
        colors = [
            "tab:blue" if row["side"].startswith("whisper_lora") else "tab:gray" for row in rows
        ]
        bars = ax.barh([row["side"] for row in rows], values, color=colors)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
        ax.set_title(f"{title}: audio seconds per second", fontsize=10)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
