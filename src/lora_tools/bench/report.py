"""results.json -> report.md + PNG plots (throughput vs concurrency, latency percentiles and time
to first token, the ratios against their goals). Everything but the plotting is plain data in,
text out (unit-tested)."""

import json
import math
from collections import defaultdict
from pathlib import Path

from lora_tools.bench import speed_report
from lora_tools.bench.config import BenchConfig
from lora_tools.bench.stats import Ratio, median, paired_ratios

GOALS = {
    "P1": 0.95,
    "P2": 0.95,
    "P2-none": 0.98,
    "P3": 0.80,
    "P5": 2.0,
    "P6": 1.2,
    "P7": speed_report.P7_GOAL,
}
TITLES = {
    "P1": "Triton ÷ in-process AsyncLLM, throughput (cost of Triton and our glue)",
    "P2": "4 adapters mixed ÷ base model only, throughput (cost of multi-LoRA)",
    "P2-none": "no adapter on the LoRA engine ÷ base model only, throughput (cost of LoRA layers "
    "that no request uses)",
    "P3": "32 adapters ÷ 1 adapter, throughput (adapter swapping)",
    "P5": "whisper_lora real-time factor ÷ transformers pipeline",
    "P6": "memory per loaded adapter ÷ adapter file size",
    "P7": speed_report.P7_TITLE,
}
MODEL_TITLES = {"whisper": "whisper_lora", "qwen_vl": "qwen_vl_lora"}
BUSY_CORES = 0.25  # other processes using more than this many cores: "the machine was busy"


# ---- lookups ---------------------------------------------------------------------------------
def _by_round(measurements: list[dict], side: str, workload: str, c: int, phase=None) -> dict:
    """rep -> throughput of the matching measurements."""
    found = {}
    for m in measurements:
        if (
            m["side"] == side
            and m["workload"] == workload
            and m["concurrency"] == c
            and (phase is None or m["phase"] == phase)
        ):
            found[m["rep"]] = m["summary"]["throughput"]
    return found


def median_throughput(measurements: list[dict], side: str, workload: str, c: int) -> float:
    return median(_by_round(measurements, side, workload, c).values())


def _paired(numerator: dict, denominator: dict) -> tuple[float, ...]:
    reps = sorted(set(numerator) & set(denominator))
    return paired_ratios([numerator[r] for r in reps], [denominator[r] for r in reps])


def _label(code: str, kind: str) -> str:
    return f"{code} {MODEL_TITLES.get(kind, kind)}"


def phase_a_ratios(kind: str, result: dict, config: BenchConfig) -> list[Ratio]:
    spec = config.model(kind)
    c = spec.main_concurrency
    ms = result.get("measurements", [])
    ratios = [
        Ratio(
            _label("P2", kind),
            _paired(
                _by_round(ms, "triton", "mixed", c, "A"), _by_round(ms, "triton", "base", c, "A")
            ),
            GOALS["P2"],
        ),
        Ratio(
            _label("P2-none", kind),
            _paired(
                _by_round(ms, "triton", "nolora", c, "A"), _by_round(ms, "triton", "base", c, "A")
            ),
            GOALS["P2-none"],
        ),
        Ratio(
            _label("P3", kind),
            _paired(
                _by_round(ms, "triton", "many", c, "A"), _by_round(ms, "triton", "single", c, "A")
            ),
            GOALS["P3"],
        ),
    ]
    if kind == "whisper" and result.get("hf"):
        served = {
            rep: rate * spec.clip_seconds
            for rep, rate in _by_round(ms, "triton", "nolora", config.p5_concurrency, "A").items()
        }
        for index, batch in enumerate(config.hf_batch_sizes):
            hf = {h["rep"]: h["rtf"] for h in result["hf"] if h.get("batch_size", 1) == batch}
            name = _label("P5", kind) + ("" if index == 0 else f" (pipeline batch {batch})")
            ratios.append(Ratio(name, _paired(served, hf), GOALS["P5"]))
    return ratios


UNSTREAMED = "final"  # run.UNSTREAMED: the sweep's requests, not streamed


def p1_ratio(
    kind: str, result: dict, config: BenchConfig, c: int | None = None, workload: str = ""
) -> Ratio:
    spec = config.model(kind)
    c = c or spec.main_concurrency
    ms = result.get("measurements", [])
    w = workload or spec.sweep_workload
    name = _label("P1", kind) + ("" if c == spec.main_concurrency else f" c={c}")
    if w == UNSTREAMED:
        name += " (not streamed)"
    return Ratio(
        name,
        _paired(_by_round(ms, "triton", w, c, "B"), _by_round(ms, "inprocess", w, c, "B")),
        GOALS["P1"],
    )


def p6_ratio(kind: str, result: dict) -> Ratio:
    rounds = (result.get("p6") or {}).get("rounds", [])
    return Ratio(
        _label("P6", kind),
        tuple(r["rss_ratio"] for r in rounds),
        GOALS["P6"],
        higher_is_better=False,
    )


def all_ratios(results: dict, config: BenchConfig) -> list[Ratio]:
    ratios = []
    for kind, result in results.get("models", {}).items():
        if "measurements" not in result:
            continue
        ratios.append(p1_ratio(kind, result, config))
        if any(m["workload"] == UNSTREAMED for m in result["measurements"]):
            ratios.append(p1_ratio(kind, result, config, workload=UNSTREAMED))
        ratios.extend(phase_a_ratios(kind, result, config))
        ratios.append(p6_ratio(kind, result))
    speed = results.get("speed") or {}
    if "error" not in speed:
        ratios.extend(speed_report.p7_ratios(speed))
    order = {code: i for i, code in enumerate(GOALS)}
    return sorted(ratios, key=lambda r: (order.get(r.name.split()[0], 9), r.name))


def latency_rows(result: dict, workload: str, phase: str = "B") -> list[dict]:
    """Per (concurrency, side): medians over rounds of throughput, latency and TTFT."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for m in result.get("measurements", []):
        if m["phase"] == phase and m["workload"] == workload:
            groups[(m["concurrency"], m["side"])].append(m["summary"])
    rows = []
    for (c, side), summaries in sorted(groups.items()):
        row = {"concurrency": c, "side": side, "rounds": len(summaries)}
        row["requests"] = summaries[0]["requests"]
        row["throughput"] = median(s["throughput"] for s in summaries)
        for p in ("50", "90", "99"):
            row[f"p{p}"] = median(s["latency_s"][p] for s in summaries)
            row[f"ttft_p{p}"] = median(s["ttft_s"][p] for s in summaries)
        rows.append(row)
    return rows


def workload_rows(result: dict, config: BenchConfig, kind: str) -> list[dict]:
    """Phase A workloads at the main concurrency: median throughput and latency."""
    c = config.model(kind).main_concurrency
    rows = []
    for workload in ("mixed", "base", "nolora", "single", "many"):
        summaries = [
            m["summary"]
            for m in result.get("measurements", [])
            if m["phase"] == "A" and m["workload"] == workload and m["concurrency"] == c
        ]
        if summaries:
            rows.append(
                {
                    "workload": workload,
                    "rounds": len(summaries),
                    "throughput": median(s["throughput"] for s in summaries),
                    "p50": median(s["latency_s"]["50"] for s in summaries),
                    "ttft_p50": median(s["ttft_s"]["50"] for s in summaries),
                }
            )
    return rows


def load_summary(results: dict) -> dict:
    loads = []
    for result in results.get("models", {}).values():
        loads += [m.get("other_load", 0.0) for m in result.get("measurements", [])]
        loads += [h.get("other_load", 0.0) for h in result.get("hf", [])]
    if not loads:
        return {"median": math.nan, "max": math.nan, "busy_share": math.nan, "count": 0}
    return {
        "median": median(loads),
        "max": max(loads),
        "busy_share": sum(1 for x in loads if x > BUSY_CORES) / len(loads),
        "count": len(loads),
    }


# ---- markdown --------------------------------------------------------------------------------
def _fmt(value: float, digits: int = 3) -> str:
    return (
        "n/a"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else (f"{value:.{digits}f}")
    )


def _ms(seconds: float) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{seconds * 1e3:.0f}"


def ratio_table(ratios: list[Ratio]) -> list[str]:
    lines = [
        "| figure | median | rounds (min – max) | goal | met |",
        "|---|---:|---:|---:|:---:|",
    ]
    for r in ratios:
        code = r.name.split()[0]
        sign = "≥" if r.higher_is_better else "≤"
        low, high = r.spread
        met = {True: "yes", False: "**no**", None: "n/a"}[r.met]
        lines.append(
            f"| {r.name}: {TITLES.get(code, '')} | {_fmt(r.value)} | {len(r.per_repeat)} "
            f"({_fmt(low)} – {_fmt(high)}) | {sign} {r.goal:g} | {met} |"
        )
    return lines


def latency_table(rows: list[dict]) -> list[str]:
    lines = [
        "| concurrency | side | req/s | p50 ms | p90 ms | p99 ms | TTFT p50 ms | TTFT p90 ms "
        "| TTFT p99 ms | requests × rounds |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['concurrency']} | {row['side']} | {_fmt(row['throughput'], 2)} | "
            f"{_ms(row['p50'])} | {_ms(row['p90'])} | {_ms(row['p99'])} | "
            f"{_ms(row['ttft_p50'])} | {_ms(row['ttft_p90'])} | {_ms(row['ttft_p99'])} | "
            f"{row['requests']} × {row['rounds']} |"
        )
    return lines


WORKLOAD_TEXT = {
    "mixed": "4 adapters round-robin (_lora)",
    "base": "no adapter, LoRA off (_base)",
    "nolora": "no adapter, LoRA on (_lora)",
    "single": "1 adapter (_lora)",
    "many": "32 adapters round-robin (_lora)",
}


def render_markdown(results: dict, config: BenchConfig, plots: list[str]) -> str:
    ratios = all_ratios(results, config)
    load = load_summary(results)
    machine = results.get("machine", {})
    total = results.get("total_s", math.nan)
    out = ["# Benchmark report", ""]
    cpu = machine.get("cpu_model")
    if cpu:
        cpu = f" ({cpu}; {', '.join(machine.get('cpu_flags', [])) or 'no AMX / AVX-512 BF16'})"
    out.append(
        f"Run {results.get('started', '?')}: {machine.get('cpus', '?')} CPUs{cpu or ''}, "
        f"{machine.get('memory_gib', '?')} GiB ({machine.get('available_gib_at_start', '?')} "
        f"available at start), total {_fmt(total / 60, 1)} min, "
        f"{config.repeats} rounds per figure; every number is the median over rounds."
    )
    if load["count"]:
        busy = load["busy_share"] > 0
        out.append("")
        out.append(
            f"Machine load from other processes during measurements: median "
            f"{_fmt(load['median'], 2)} cores, max {_fmt(load['max'], 2)} cores; "
            f"{load['busy_share'] * 100:.0f}% of measurements ran while others used more than "
            f"{BUSY_CORES} cores."
            + (
                " **The machine was busy**: absolute numbers are low and noisy; the ratios "
                "(both sides measured in the same round) are the figures to read."
                if busy
                else ""
            )
        )
    if ratios:
        out += ["", "## Ratios against their goals", ""]
        out += ratio_table(ratios)
    for kind, result in results.get("models", {}).items():
        title = MODEL_TITLES.get(kind, kind)
        out += ["", f"## {title}", ""]
        if "error" in result:
            out += ["```", result["error"][-3000:], "```"]
            continue
        spec = config.model(kind)
        what = (
            f"{spec.clip_seconds:g} s clips (WAV)"
            if kind == "whisper"
            else f"one {spec.image_size[0]}x{spec.image_size[1]} image per request"
        )
        out.append(
            f"Requests: {what}, exactly {spec.max_tokens} output tokens each (ignore_eos), "
            f"streamed; Triton side sent by perf_analyzer over gRPC. Start-up: both Triton "
            f"models {_fmt(result.get('triton_load_s', math.nan), 0)} s, in-process engine "
            f"{_fmt(result.get('inprocess_start_s', math.nan), 0)} s."
        )
        sweep = WORKLOAD_TEXT[spec.sweep_workload].split(" (")[0]
        out += ["", f"### Latency and time to first token per concurrency ({title}: {sweep})", ""]
        out += latency_table(latency_rows(result, spec.sweep_workload))
        out += ["", f"### Workloads at concurrency {spec.main_concurrency} (Triton)", ""]
        out += ["| workload | req/s | p50 ms | TTFT p50 ms | rounds |", "|---|---:|---:|---:|---:|"]
        for row in workload_rows(result, config, kind):
            out.append(
                f"| {row['workload']}: {WORKLOAD_TEXT[row['workload']]} | "
                f"{_fmt(row['throughput'], 2)} | {_ms(row['p50'])} | {_ms(row['ttft_p50'])} | "
                f"{row['rounds']} |"
            )
        if result.get("hf"):
            served = [
                r * spec.clip_seconds
                for r in _by_round(
                    result["measurements"], "triton", "nolora", config.p5_concurrency, "A"
                ).values()
            ]
            pipeline = "; ".join(
                f"batch size {b}: "
                + _fmt(median(h["rtf"] for h in result["hf"] if h.get("batch_size", 1) == b), 2)
                for b in config.hf_batch_sizes
            )
            out += [
                "",
                f"Real-time factor (audio seconds per wall second): whisper_lora "
                f"{_fmt(median(served), 2)} at concurrency {config.p5_concurrency} (no adapter); "
                f"transformers pipeline {pipeline} ({result.get('hf_threads', '?')} torch "
                f"thread(s): the cores the whisper engine is bound to).",
            ]
        p6 = result.get("p6")
        if p6:
            rounds = p6["rounds"]
            out += [
                "",
                f"Adapter memory (P6): adapter_model.safetensors is "
                f"{p6['file_bytes'] / 2**20:.2f} MiB; loading {p6['batch_size']} more adapters "
                f"into the engine's cache added "
                + ", ".join(f"{r['rss_per_adapter'] / 2**20:.2f}" for r in rounds)
                + " MiB RSS per adapter (USS "
                + ", ".join(f"{r['uss_per_adapter'] / 2**20:.2f}" for r in rounds)
                + ").",
            ]
        for profile in result.get("profiles", []):
            if not profile["samples"]:
                out += ["", f"Profile {profile['label']}: no samples."]
                continue
            out += [
                "",
                f"Profile {profile['label']}: {profile['samples']} samples, "
                f"{profile.get('waiting', 0) * 100:.0f}% waiting/spinning; busiest lines (self):",
            ]
            out += [f"- {share * 100:4.1f}% {frame}" for frame, share in profile["top_frames"]]
            if profile.get("top_inclusive"):
                out.append(
                    "  under (inclusive): "
                    + "; ".join(
                        f"{frame} {share * 100:.0f}%" for frame, share in profile["top_inclusive"]
                    )
                )
    if "wer" in results:
        wer_plot = next((p for p in plots if Path(p).stem == WER_PLOT), None)
        out += ["", *wer_section(results["wer"], wer_plot)]
        plots = [p for p in plots if p != wer_plot]
    if "speed" in results:
        speed_plot = next((p for p in plots if Path(p).stem == speed_report.PLOT), None)
        out += ["", *speed_report.section(results["speed"], speed_plot)]
        plots = [p for p in plots if p != speed_plot]
    if "words" in results:
        from lora_tools.bench import word_timing

        out += ["", *word_timing.report_lines(results["words"])]
    out += ["", "## How each figure is measured", ""]
    out += [f"- {line}" for line in method_notes(config)]
    if plots:
        out += ["", "## Plots", ""]
        out += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(out) + "\n"


def method_notes(config: BenchConfig) -> list[str]:
    return [
        "Triton side: perf_analyzer over gRPC with --streaming, a fixed --request-count at a "
        "fixed concurrency (closed loop), every request's send and response times read from its "
        "--profile-export-file. Throughput = requests / (last response - first send); latency = "
        "send to last response; time to first token (TTFT) = send to first response.",
        "Every request decodes exactly max_tokens tokens (ignore_eos), so compared workloads do "
        "equal work; the multimodal processor cache (and for Qwen-VL prefix caching) is off in "
        "both the served and the in-process engine, so repeated clips/images are not cache hits.",
        f"Rounds: each figure is measured {config.repeats} times; the compared configurations "
        "run in the same round, one after the other, in a rotating order; a ratio is taken per "
        "round and the median reported (with the range over rounds).",
        "Only the measured side runs: the other Triton model's stub is paused (SIGSTOP) and the "
        f"bench waits {config.settle_s:g} s before each measurement (see Isolation in run.py).",
        "P1: the same requests (the perf_analyzer input-data entries, turned into engine prompts "
        "by our own task code before timing) sent to an AsyncLLM started in the bench process with "
        "the served model's engine arguments and environment, same concurrency, same streaming.",
        f"P2: {config.mixed_adapters} adapters round-robin on <model>_lora ÷ no adapter on "
        "<model>_base (enable_lora off). The `nolora` row (no adapter on the LoRA engine) splits "
        "the cost: LoRA layers without adapters vs the adapters' own deltas.",
        f"P3: {config.many_adapters} adapters round-robin (max_loras {config.max_loras}, "
        f"max_cpu_loras {config.max_cpu_loras}; all {config.many_adapters} loaded into the cache "
        "by the warm-up; each round goes on where the last one stopped) ÷ one adapter.",
        "P5: whisper_lora real-time factor (requests without an adapter × clip seconds per "
        "second) ÷ transformers' automatic-speech-recognition pipeline on the same whisper-base "
        "folder and the same decoded clips, float32, greedy, min_new_tokens = max_new_tokens, "
        "with as many torch threads as cores the whisper engine is bound to.",
        f"P6: RSS of the in-process engine's EngineCore + worker before and after loading "
        f"{config.p6_batch_size} adapters (AsyncLLM.add_lora: into the CPU LoRA cache), per "
        "adapter, ÷ adapter_model.safetensors; each batch one round, after a warm-up adapter.",
        "Machine load: CPU time of all other processes per second of each measurement "
        "(system busy time minus the bench's own processes).",
    ]


# ---- word error rate vs faster-whisper (wer.py) --------------------------------------------------
WER_PLOT = "wer_vs_faster_whisper"
SIDES = (("ours", "whisper_lora"), ("faster_whisper", "faster-whisper"))


def wer_rows(wer: dict) -> list[dict]:
    """One row per setting measured on both sides: WER and total seconds, ours and theirs."""
    rows = []
    for name, setting in wer.get("settings", {}).items():
        ours, peer = setting.get("ours"), setting.get("faster_whisper")
        if not (ours and peer):
            continue
        rows.append(
            {
                "setting": name,
                "label": setting.get("label", name),
                "words": ours["reference_words"],
                "ours_errors": ours["word_errors"],
                "faster_whisper_errors": peer["word_errors"],
                "ours_wer": ours["wer"],
                "faster_whisper_wer": peer["wer"],
                "ours_s": ours["total_s"],
                "faster_whisper_s": peer["total_s"],
            }
        )
    return rows


def beam_throughput_ratio(rows: list[dict], side: str) -> float:
    """Requests per second at beam 5 ÷ at the defaults (greedy), on one side."""
    by_name = {row["setting"]: row for row in rows}
    if "beam5" not in by_name or "defaults" not in by_name:
        return math.nan
    return by_name["defaults"][f"{side}_s"] / by_name["beam5"][f"{side}_s"]


def wer_section(wer: dict, plot: str | None = None) -> list[str]:
    out = ["## Word error rate vs faster-whisper", ""]
    if "error" in wer:
        return out + ["```", wer["error"][-3000:], "```"]
    rows = wer_rows(wer)
    count = len(wer.get("sentences", []))
    out.append(
        f"{count} espeak-ng sentences ({_fmt(wer.get('audio_s', math.nan), 0)} s of speech, "
        "several voices and speeds), the same 16 kHz WAV files to both sides, language en, one "
        "request at a time; WER after Whisper's English normaliser, over all words together. "
        f"faster-whisper: float32, same CTranslate2 {wer.get('model', 'whisper-base')}, "
        f"{wer.get('threads', '?')} "
        "thread(s) (the cores whisper_lora's engine is bound to). Times: sum of the requests' "
        "wall times, after one untimed warm-up request."
    )
    out += [
        "",
        "| setting | whisper_lora WER | faster-whisper WER | whisper_lora s | "
        "faster-whisper s | whisper_lora no worse |",
        "|---|---:|---:|---:|---:|:---:|",
    ]
    for row in rows:
        no_worse = "yes" if row["ours_errors"] <= row["faster_whisper_errors"] else "**no**"
        out.append(
            f"| {row['label']} | {_fmt(row['ours_wer'])} ({row['ours_errors']}/{row['words']}) | "
            f"{_fmt(row['faster_whisper_wer'])} ({row['faster_whisper_errors']}/{row['words']}) "
            f"| {_fmt(row['ours_s'], 1)} | {_fmt(row['faster_whisper_s'], 1)} | {no_worse} |"
        )
    out += [
        "",
        "Beam 5 ÷ greedy throughput (requests per second at beam 5 ÷ at the defaults): "
        + ", ".join(
            f"{title} {_fmt(beam_throughput_ratio(rows, side), 2)}" for side, title in SIDES
        )
        + ".",
    ]
    loads = {
        title: [s[side]["other_load"] for s in wer.get("settings", {}).values() if side in s]
        for side, title in SIDES
    }
    if all(loads.values()):
        out.append(
            "Other processes' load (cores busy, at most): "
            + ", ".join(f"{t}'s runs {_fmt(max(v), 2)}" for t, v in loads.items())
            + f" (over {BUSY_CORES}: the times are noisy)."
        )
    out += [
        "",
        "Settings of each row:",
    ]
    for name, setting in wer.get("settings", {}).items():
        ours = setting.get("ours_parameters") or {}
        out.append(
            f"- {setting.get('label', name)}: whisper_lora `sampling_parameters` "
            + (f"`{json.dumps(ours)}`" if ours else "none (its model.json defaults)")
            + "; faster-whisper `transcribe(audio, "
            + ", ".join(
                f"{k}={v!r}" for k, v in (setting.get("faster_whisper_arguments") or {}).items()
            )
            + ")`"
        )
    mistakes = _wer_mistakes(wer)
    if mistakes:
        out += ["", "Sentences with word errors (reference, then each side's text):", ""]
        out += mistakes
    if plot:
        out += ["", f"![{WER_PLOT}]({Path(plot).name})"]
    return out


def _wer_mistakes(wer: dict) -> list[str]:
    lines = []
    sentences = wer.get("sentences", [])
    for name, setting in wer.get("settings", {}).items():
        sides = [(title, setting.get(side)) for side, title in SIDES if setting.get(side)]
        for index, reference in enumerate(sentences):
            wrong = [(t, s) for t, s in sides if s.get("errors", [0] * len(sentences))[index]]
            if not wrong:
                continue
            lines.append(f"- {name}: “{reference}”")
            lines += [
                f"  - {title} ({s['errors'][index]} errors): “{s['texts'][index]}”"
                for title, s in wrong
            ]
    return lines


# ---- plots -----------------------------------------------------------------------------------
def write_plots(results: dict, config: BenchConfig, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k, r in results.get("models", {}).items() if r.get("measurements")]
    paths = []
    if kinds:
        fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4), squeeze=False)
        for ax, kind in zip(axes[0], kinds, strict=True):
            rows = latency_rows(results["models"][kind], config.model(kind).sweep_workload)
            for side, style in (("triton", "o-"), ("inprocess", "s--")):
                points = [(r["concurrency"], r["throughput"]) for r in rows if r["side"] == side]
                if points:
                    ax.plot(*zip(*points, strict=True), style, label=side)
            sweep = WORKLOAD_TEXT[config.model(kind).sweep_workload].split(" (")[0]
            ax.set_title(f"{MODEL_TITLES[kind]}: throughput ({sweep})", fontsize=10)
            ax.set_xlabel("concurrency")
            ax.set_ylabel("requests / s")
            ax.legend()
            ax.grid(alpha=0.3)
        fig.tight_layout()
        paths.append(str(out / "throughput_vs_concurrency.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)

        fig, axes = plt.subplots(2, len(kinds), figsize=(6 * len(kinds), 7), squeeze=False)
        for column, kind in enumerate(kinds):
            rows = latency_rows(results["models"][kind], config.model(kind).sweep_workload)
            panels = ((0, "p", "latency"), (1, "ttft_p", "time to first token"))
            for row_index, prefix, what in panels:
                ax = axes[row_index][column]
                for side, style in (("triton", "-"), ("inprocess", "--")):
                    side_rows = [r for r in rows if r["side"] == side]
                    for p, marker in (("50", "o"), ("90", "^"), ("99", "v")):
                        points = [(r["concurrency"], r[f"{prefix}{p}"] * 1e3) for r in side_rows]
                        if points:
                            ax.plot(
                                *zip(*points, strict=True),
                                marker=marker,
                                linestyle=style,
                                label=f"{side} p{p}",
                            )
                ax.set_title(f"{MODEL_TITLES[kind]}: {what}")
                ax.set_xlabel("concurrency")
                ax.set_ylabel("ms")
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(str(out / "latency_percentiles.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)

    ratios = [r for r in all_ratios(results, config) if r.per_repeat]
    if ratios:
        fig, ax = plt.subplots(figsize=(9, 0.5 * len(ratios) + 1.5))
        names = [r.name for r in ratios]
        values = [r.value / r.goal for r in ratios]
        colors = ["tab:green" if r.met else "tab:red" for r in ratios]
        ax.barh(names, values, color=colors)
        for index, r in enumerate(ratios):
            low, high = r.spread
            ax.plot([low / r.goal, high / r.goal], [index, index], color="black", lw=1)
            sign = "≥" if r.higher_is_better else "≤"
            ax.text(
                max(values + [1.0]) * 1.02,
                index,
                f"{r.value:.2f} (goal {sign} {r.goal:g})",
                va="center",
                fontsize=8,
            )
        ax.axvline(1.0, color="black", linestyle="--", lw=1)
        ax.set_xlabel("ratio ÷ goal (P6: lower is better, the others higher)")
        ax.invert_yaxis()
        ax.set_xlim(0, max(values + [1.0]) * 1.45)
        fig.tight_layout()
        paths.append(str(out / "ratios_vs_goals.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    rows = wer_rows(results.get("wer", {}))
    if rows:
        paths.append(str(out / f"{WER_PLOT}.png"))
        _wer_plot(plt, rows, paths[-1])
    speed = results.get("speed") or {}
    if speed_report.side_rows(speed):
        paths.append(str(out / f"{speed_report.PLOT}.png"))
        speed_report.write_plot(plt, speed, paths[-1])
    return paths


def _wer_plot(plt, rows: list[dict], path: str) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    width = 0.38
    for ax, (key, what) in zip(axes, (("wer", "word error rate"), ("s", "seconds")), strict=True):
        for offset, (side, title) in zip((-width / 2, width / 2), SIDES, strict=True):
            values = [row[f"{side}_{key}"] for row in rows]
            bars = ax.bar([i + offset for i in range(len(rows))], values, width, label=title)
            ax.bar_label(bars, fmt="%.3f" if key == "wer" else "%.1f", fontsize=7)
        ax.set_xticks(range(len(rows)), [row["setting"] for row in rows])
        ax.set_title(what, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(results: dict, config: BenchConfig, out: Path) -> Path:
    plots = write_plots(results, config, out)
    path = out / "report.md"
    path.write_text(render_markdown(results, config, plots))
    return path
