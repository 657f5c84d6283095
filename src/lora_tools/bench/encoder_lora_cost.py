"""What LoRA on Whisper's encoder and cross-attention costs: throughput with all-layer adapters
divided by throughput with decoder-only adapters, measured in one run through tritonserver.

    .venv/bin/python -m lora_tools.bench.encoder_lora_cost [--repeats 3] [--concurrency 4]

Starts its own tritonserver (whisper_lora only) unless --grpc-url points at a running one. The
two workloads alternate, so drift on a shared machine hits both; the line printed last is the
median ratio.
"""

import argparse
import statistics
import tempfile
from pathlib import Path

from lora_serving.launcher import REPO_ROOT, TritonServer
from lora_tools.bench import perf_data
from lora_tools.bench.perf_analyzer import run_perf_analyzer
from lora_tools.bench.processes import free_port

WORKLOADS = {"all-layer": ["all_layers"], "decoder-only": ["alpha"]}


def measure(
    grpc_url: str, *, repeats: int, concurrency: int, seconds: float, max_tokens: int, folder: Path
) -> dict[str, list[float]]:
    inputs = {
        name: perf_data.write(
            perf_data.whisper_input_data(adapters, seconds=seconds, max_tokens=max_tokens),
            folder / f"{name}.json",
        )
        for name, adapters in WORKLOADS.items()
    }
    results: dict[str, list[float]] = {name: [] for name in WORKLOADS}
    for repeat in range(1, repeats + 1):
        for name, data in inputs.items():
            row = run_perf_analyzer(
                "whisper_lora",
                data,
                grpc_url=grpc_url,
                concurrency=concurrency,
                requests_per_window=8,
            )
            results[name].append(row["Inferences/Second"])
            print(
                f"  repeat {repeat}: {name:12s} {row['Inferences/Second']:.3f} req/s, "
                f"p50 {row['p50 latency'] / 1e3:.0f} ms",
                flush=True,
            )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc-url", help="host:port of a running server (default: start one)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0, help="clip length")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    server = None
    if args.grpc_url is None:
        server = TritonServer(
            REPO_ROOT / "model_repository",
            http=free_port(),
            grpc=free_port(),
            metrics=free_port(),
            extra_args=["--model-control-mode=explicit", "--load-model=whisper_lora"],
            log_path=Path(tempfile.gettempdir()) / "encoder_lora_cost.log",
        )
        server.wait_ready(timeout_s=600)
        args.grpc_url = f"127.0.0.1:{server.grpc}"
    try:
        with tempfile.TemporaryDirectory() as folder:
            results = measure(
                args.grpc_url,
                repeats=args.repeats,
                concurrency=args.concurrency,
                seconds=args.seconds,
                max_tokens=args.max_tokens,
                folder=Path(folder),
            )
    finally:
        if server is not None:
            server.stop()
    ratios = [a / d for a, d in zip(results["all-layer"], results["decoder-only"], strict=True)]
    print(
        f"encoder-LoRA cost: all-layer / decoder-only throughput = "
        f"{statistics.median(ratios):.3f} (median of {len(ratios)}; each: "
        f"{', '.join(f'{r:.3f}' for r in ratios)})"
    )


if __name__ == "__main__":
    main()
