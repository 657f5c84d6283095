"""Run Triton's perf_analyzer against our decoupled models and read its CSV report.

Our models stream, so perf_analyzer must use gRPC with --streaming (it then measures latency to
the first response). count_windows mode with a generous stability band keeps runs short and
finite on a small, noisy machine. `run_requests` sends a fixed number of requests instead and
returns every request's timings from perf_analyzer's profile export (the benchmark repeats and
takes medians itself).
"""

import csv
import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lora_serving.launcher import REPO_ROOT
from lora_tools.bench.stats import RequestRecord

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
        _run_checked(command, timeout_s)
        with report.open() as handle:
            row = next(csv.DictReader(handle))
    return {key: float(value) for key, value in row.items()}


def _run_checked(command: list[str], timeout_s: float) -> None:
    finished = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if finished.returncode != 0:
        raise RuntimeError(
            f"perf_analyzer failed ({finished.returncode}):\n{finished.stdout[-3000:]}"
            f"\n{finished.stderr[-2000:]}"
        )


@dataclass(frozen=True)
class Measurement:
    """One fixed-size perf_analyzer run: every request's timings, plus perf_analyzer's own
    throughput figure (requests per second) for cross-checking ours."""

    records: list[RequestRecord]
    failed: int
    reported_throughput: float


def records_from_profile(export: dict) -> tuple[list[RequestRecord], int]:
    """perf_analyzer's --profile-export-file JSON -> (completed requests, failed requests).

    With --streaming a decoupled model's responses all carry timestamps: the first is the time
    to first token, the last the end of the request. A request with no response failed."""
    records, failed = [], 0
    for experiment in export.get("experiments", []):
        for request in experiment.get("requests", []):
            responses = request.get("response_timestamps") or []
            if not responses:
                failed += 1
                continue
            records.append(
                RequestRecord(
                    start=request["timestamp"] / 1e9,
                    first=min(responses) / 1e9,
                    end=max(responses) / 1e9,
                    responses=len(responses),
                )
            )
    return records, failed


def run_requests(
    model: str,
    input_data: Path,
    *,
    grpc_url: str,
    concurrency: int,
    request_count: int,
    timeout_s: float = 900,
    attempts: int = 3,
) -> Measurement:
    """Exactly `request_count` requests at `concurrency` (closed loop, no stabilisation: the
    caller repeats and takes medians), entries of `input_data` in order, streamed over gRPC.

    perf_analyzer 2.51 now and then exits 0 having measured every request but leaving its
    profile export empty or cut short (seen with 800 KB exports of image requests); such a run
    is measured again, up to `attempts` runs in all."""
    for attempt in range(1, attempts + 1):
        with tempfile.TemporaryDirectory() as folder:
            report, export = Path(folder) / "report.csv", Path(folder) / "profile.json"
            command = [
                str(PERF_ANALYZER),
                *("-m", model, "-u", grpc_url, "-i", "grpc", "--streaming"),
                *("--input-data", str(input_data)),
                *("--concurrency-range", str(concurrency)),
                *("--request-count", str(request_count)),
                *("--profile-export-file", str(export), "-f", str(report)),
            ]
            _run_checked(command, timeout_s)
            text = export.read_text()
            try:
                profile = json.loads(text)
            except json.JSONDecodeError as err:
                if attempt == attempts:
                    raise RuntimeError(
                        f"perf_analyzer left an incomplete profile export {attempts} times "
                        f"({len(text)} characters: {err})"
                    ) from err
                print(
                    f"perf_analyzer left an incomplete profile export ({len(text)} characters); "
                    f"measuring again (attempt {attempt + 1} of {attempts})",
                    flush=True,
                )
                continue
            records, failed = records_from_profile(profile)
            with report.open() as handle:
                row = next(csv.DictReader(handle))
            return Measurement(records, failed, float(row["Inferences/Second"]))
    raise AssertionError("unreachable: the last attempt returns or raises")
