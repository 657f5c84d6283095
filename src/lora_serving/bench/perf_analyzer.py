"""Run Triton's perf_analyzer against our decoupled models and read its CSV report.

Our models stream, so perf_analyzer must use gRPC with --streaming (it then measures latency to
the first response). count_windows mode with a generous stability band keeps runs short and
finite on a small, noisy machine.
"""

import csv
import subprocess
import tempfile
from pathlib import Path

from lora_serving.launcher import REPO_ROOT

PERF_ANALYZER = REPO_ROOT / "scripts" / "perf_analyzer"


def run_perf_analyzer(
    model: str,
    input_data: Path,
    *,
    grpc_url: str,
    concurrency: int,
    requests_per_window: int = 8,
    stability_percentage: int = 100,
    max_trials: int = 10,
    timeout_s: float = 900,
) -> dict[str, float]:
    """One measurement at one concurrency; returns the CSV row (throughput, latencies in us)."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.csv"
        command = [
            str(PERF_ANALYZER),
            "-m",
            model,
            "-u",
            grpc_url,
            "-i",
            "grpc",
            "--streaming",
            "--input-data",
            str(input_data),
            "--concurrency-range",
            str(concurrency),
            "--measurement-mode",
            "count_windows",
            "--measurement-request-count",
            str(requests_per_window),
            "--stability-percentage",
            str(stability_percentage),
            "--max-trials",
            str(max_trials),
            "-f",
            str(report),
        ]
        finished = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        if finished.returncode != 0:
            raise RuntimeError(
                f"perf_analyzer failed ({finished.returncode}):\n{finished.stdout[-3000:]}"
                f"\n{finished.stderr[-2000:]}"
            )
        with report.open() as handle:
            row = next(csv.DictReader(handle))
    return {key: float(value) for key, value in row.items()}
