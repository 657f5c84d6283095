"""qwen_vl_lora beside Triton's own vllm_backend: same tritonserver, same tiny Qwen2-VL, adapters
and engine arguments, the same requests through perf_analyzer (gRPC, streamed), servers one at a
time in alternating order.

    .venv/bin/python -m lora_tools.bench.vs_vllm_backend --vllm-backend-src PATH/vllm_backend/src

PATH is a checkout of github.com/triton-inference-server/vllm_backend (not installed by setup:
the NGC image ships it, PyPI does not). Its model.py runs under Triton's Python backend as
`backend: "python"`, with the few edits in COMPAT_EDITS so that it loads on this machine's vLLM
and Triton stub; its request path is left as it is. Prints each measurement and writes
results/vs-vllm-backend-<time>/ (report.md, a plot, results.json).
"""

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from lora_serving.launcher import REPO_ROOT, TritonServer
from lora_tools.bench import perf_data
from lora_tools.bench.perf_analyzer import run_perf_analyzer
from lora_tools.bench.processes import free_port
from lora_tools.bench.repository import FLEET_PATH_KEYS
from lora_tools.bench.stats import median, paired_ratios

SHIPPED = REPO_ROOT / "model_repository" / "qwen_vl_lora"
# (file, text, replacement, why): applied where the text occurs.
COMPAT_EDITS = (
    (
        "model.py",
        "import asyncio\n",
        'import locale\nlocale.setlocale(locale.LC_CTYPE, "C.UTF-8")\nimport asyncio\n',
        "the stub's interpreter runs with an ASCII locale; importing vllm reads UTF-8 files",
    ),
    (
        "utils/metrics.py",
        "from vllm.v1.metrics.loggers import StatLoggerBase, build_1_2_5_buckets",
        "from vllm.v1.metrics.loggers import StatLoggerBase\n"
        "from vllm.v1.metrics.buckets import build_1_2_5_buckets",
        "vLLM 0.32 moved build_1_2_5_buckets",
    ),
    (
        "utils/request.py",
        "from vllm.inputs.data import TokensPrompt",
        "from vllm.inputs import TokensPrompt",
        "vLLM 0.32 has no vllm.inputs.data",
    ),
)
SOURCES = ("model.py", "utils/metrics.py", "utils/request.py", "utils/vllm_backend_utils.py")
WORKLOADS = {"base": [None], "mixed": ["alpha", "beta"]}
MODEL_NAMES = {"ours": "qwen_vl_lora", "vllm_backend": "vllm_model"}


def shipped_settings() -> dict:
    return json.loads((SHIPPED / "1" / "model.json").read_text())


def demo_adapters() -> dict[str, str]:
    folder = REPO_ROOT / "demo_models" / "qwen2-vl-adapters"
    return {name: str((folder / name).resolve()) for name in ("alpha", "beta")}


def apply_compat_edits(name: str, text: str) -> tuple[str, list[str]]:
    """The file's text with every edit for it applied, and why each applied edit was needed."""
    applied = []
    for file, old, new, why in COMPAT_EDITS:
        if file == name and old in text and new not in text:
            text = text.replace(old, new, 1)
            applied.append(f"{name}: {why}")
    return text, applied


def vllm_backend_repository(source: Path, folder: Path, settings: dict) -> list[str]:
    """vllm_backend's model.py as a Python-backend model `vllm_model` with our engine arguments
    (model.json less our own `serving` and `environment` blocks) and the same adapters."""
    model = folder / "vllm_model"
    (model / "1" / "utils").mkdir(parents=True)
    applied = []
    for name in SOURCES:
        text, edits = apply_compat_edits(name, (source / name).read_text())
        (model / "1" / name).write_text(text)
        applied += edits
    (model / "config.pbtxt").write_text(
        'backend: "python"\ninstance_group [ { count: 1, kind: KIND_MODEL } ]\n'
    )
    engine = {k: v for k, v in settings.items() if k not in ("serving", "environment")}
    engine["model"] = str((SHIPPED / "1" / settings["model"]).resolve())
    (model / "1" / "model.json").write_text(json.dumps(engine, indent=1))
    (model / "1" / "multi_lora.json").write_text(json.dumps(demo_adapters()))
    return applied


def our_repository(folder: Path, settings: dict) -> None:
    """The shipped qwen_vl_lora serving exactly the demo adapters (no adapter fleet)."""
    model = folder / "qwen_vl_lora"
    shutil.copytree(SHIPPED, model, ignore=shutil.ignore_patterns("__pycache__"))
    ours = json.loads(json.dumps(settings))
    ours["model"] = str((SHIPPED / "1" / settings["model"]).resolve())
    fleet = ours["serving"].get("adapters", {})
    for key in FLEET_PATH_KEYS:
        fleet.pop(key, None)
    (model / "1" / "model.json").write_text(json.dumps(ours, indent=1))
    (model / "1" / "multi_lora.json").write_text(json.dumps(demo_adapters()))


def as_vllm_backend_entry(entry: dict, prompt: str) -> dict:
    """One of our perf_analyzer entries as vllm_backend takes it: the prompt our task builds
    (chat template, image placeholder) as text_input, the adapter inside sampling_parameters."""
    sampling = json.loads(entry["sampling_parameters"]["content"][0])
    if "lora_name" in entry:
        sampling["lora_name"] = entry["lora_name"]["content"][0]
    converted = {
        "text_input": {"content": [prompt], "shape": [1]},
        "image": entry["image"],
        "exclude_input_in_output": {"content": [True], "shape": [1]},
        "sampling_parameters": {"content": [json.dumps(sampling)], "shape": [1]},
    }
    if "stream" in entry:
        converted["stream"] = entry["stream"]
    return converted


def input_files(folder: Path, max_tokens: int) -> dict[tuple[str, str], Path]:
    from lora_tools.bench.inprocess import InProcessEngine  # our task code builds the prompts

    prompts = InProcessEngine(SHIPPED / "1" / "model.json", "vision_chat")
    files = {}
    for workload, adapters in WORKLOADS.items():
        data = perf_data.qwen_input_data(adapters, max_tokens=max_tokens, stream=True)
        files[("ours", workload)] = perf_data.write(data, folder / f"ours-{workload}.json")
        converted = [
            as_vllm_backend_entry(entry, request.prompt["prompt"])
            for entry, request in zip(data["data"], prompts.prepare(data), strict=True)
        ]
        path = folder / f"vllm_backend-{workload}.json"
        files[("vllm_backend", workload)] = perf_data.write({"data": converted}, path)
    return files


def measure_side(side, repository, files, concurrencies, results, label, folder) -> None:
    server = TritonServer(
        repository,
        http=free_port(),
        grpc=free_port(),
        metrics=free_port(),
        log_path=folder / f"tritonserver-{side}.log",
    )
    try:
        server.wait_ready(timeout_s=900)
        url, model = f"127.0.0.1:{server.grpc}", MODEL_NAMES[side]
        run_perf_analyzer(model, files[(side, "base")], grpc_url=url, concurrency=1)  # warm-up
        for workload in WORKLOADS:
            for concurrency in concurrencies:
                row = run_perf_analyzer(
                    model,
                    files[(side, workload)],
                    grpc_url=url,
                    concurrency=concurrency,
                    requests_per_window=16,
                )
                results.setdefault(f"{side} {workload} c={concurrency}", []).append(row)
                rate, p50_ms = row["Inferences/Second"], row["p50 latency"] / 1e3
                print(
                    f"{label} {side:12s} {workload:6s} c={concurrency} "
                    f"{rate:6.2f} req/s  p50 {p50_ms:5.0f} ms",
                    flush=True,
                )
    finally:
        server.stop()


def summary(results: dict, concurrencies) -> list[dict]:
    rows = []
    for workload in WORKLOADS:
        for concurrency in concurrencies:
            ours = results[f"ours {workload} c={concurrency}"]
            theirs = results[f"vllm_backend {workload} c={concurrency}"]
            ratios = paired_ratios(
                [r["Inferences/Second"] for r in ours], [r["Inferences/Second"] for r in theirs]
            )
            rows.append(
                {
                    "workload": workload,
                    "concurrency": concurrency,
                    "ours_rps": median(r["Inferences/Second"] for r in ours),
                    "vllm_backend_rps": median(r["Inferences/Second"] for r in theirs),
                    "ratio": median(ratios),
                    "ratio_min": min(ratios),
                    "ratio_max": max(ratios),
                    "ours_p50_ms": median(r["p50 latency"] for r in ours) / 1e3,
                    "vllm_backend_p50_ms": median(r["p50 latency"] for r in theirs) / 1e3,
                }
            )
    return rows


def write_report(out: Path, rows: list[dict], edits: list[str], rounds: int, max_tokens: int):
    lines = [
        "# qwen_vl_lora vs Triton's vllm_backend",
        "",
        f"Same tritonserver, same tiny Qwen2-VL, adapters (alpha, beta) and engine arguments; "
        f"one 224x224 image and {max_tokens} output tokens (ignore_eos) per request, streamed, "
        f"perf_analyzer over gRPC; the two servers one at a time, alternating, {rounds} rounds; "
        "medians, ratio range over rounds. `base`: no adapter; `mixed`: alpha and beta "
        "round-robin.",
        "",
        "| workload | concurrency | ours req/s | vllm_backend req/s | ours ÷ vllm_backend "
        "(range) | ours p50 ms | vllm_backend p50 ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['concurrency']} | {r['ours_rps']:.2f} | "
            f"{r['vllm_backend_rps']:.2f} | {r['ratio']:.2f} ({r['ratio_min']:.2f}-"
            f"{r['ratio_max']:.2f}) | {r['ours_p50_ms']:.0f} | {r['vllm_backend_p50_ms']:.0f} |"
        )
    lines += ["", "vllm_backend's model.py was loaded with these edits (nothing else changed):"]
    lines += [f"- {edit}" for edit in edits] or ["- none"]
    lines += ["", "![ratios](ratios.png)", ""]
    (out / "report.md").write_text("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    labels = [f"{r['workload']}\nc={r['concurrency']}" for r in rows]
    ax.bar(labels, [r["ratio"] for r in rows], color="#4c72b0")
    ax.errorbar(
        labels,
        [r["ratio"] for r in rows],
        yerr=[
            [r["ratio"] - r["ratio_min"] for r in rows],
            [r["ratio_max"] - r["ratio"] for r in rows],
        ],
        fmt="none",
        color="black",
        capsize=3,
    )
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.axhline(1.10, color="green", linestyle="--", linewidth=0.8, label="goal 1.10 (c ≥ 2)")
    ax.set_ylabel("throughput ÷ vllm_backend")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "ratios.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-backend-src", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrencies", default="1,2,4")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrencies.split(",")]
    out = REPO_ROOT / "results" / f"vs-vllm-backend-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    settings = shipped_settings()
    edits = vllm_backend_repository(args.vllm_backend_src, out / "repo-vllm_backend", settings)
    our_repository(out / "repo-ours", settings)
    files = input_files(out, args.max_tokens)
    # vllm_backend has no environment block: both servers get model.json's (threads, KV space).
    os.environ.update(settings.get("environment", {}))
    results: dict = {}
    repositories = {"ours": out / "repo-ours", "vllm_backend": out / "repo-vllm_backend"}
    for round_index in range(args.rounds):
        order = ["vllm_backend", "ours"] if round_index % 2 == 0 else ["ours", "vllm_backend"]
        for side in order:
            label = f"round {round_index + 1}/{args.rounds}"
            measure_side(side, repositories[side], files, concurrencies, results, label, out)
    rows = summary(results, concurrencies)
    (out / "results.json").write_text(json.dumps({"raw": results, "summary": rows}, indent=1))
    write_report(out, rows, edits, args.rounds, args.max_tokens)
    for r in rows:
        print(
            f"{r['workload']:6s} c={r['concurrency']}: ours ÷ vllm_backend {r['ratio']:.2f} "
            f"({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
        )
    print(f"report: {out / 'report.md'}")


if __name__ == "__main__":
    main()
