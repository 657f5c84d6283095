"""Soak test: mixed adapters, both models, streamed and not, for a while; then the figures.

`make soak` (or `python -m lora_tools.soak`) starts a tritonserver of its own on free ports, or
uses a running one (`--grpc-url` and `--server-pid`, optionally `--server-log`). Each of
`--concurrency` workers sends requests in turn from a fixed mix (whisper_lora and qwen_vl_lora;
base, alpha, beta; streamed and not); every 20th request (5 %) is streamed and cancelled by its
client after the first partial text. After `--warmup` seconds the server's process-tree RSS is
taken as the start; at the end again. It reports requests, errors, cancellations, p50/p99
latency and RSS, and exits 1 on any error or on RSS growth of `--max-rss-growth` (default 5 %)
or more. If the server dies (its process gone, or connections refused), the soak stops at once,
prints the end of the server's log (where a crash stack lands) and exits 2.
"""

import argparse
import io
import itertools
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ADAPTERS = (None, "alpha", "beta")
CANCEL_EVERY = 20  # 5 % of requests are cancelled mid-stream by their client
MODELS = ("whisper_lora", "qwen_vl_lora")
SPEECH = "Soak testing keeps the server honest, one request after another."


@dataclass
class SoakReport:
    duration_s: float
    concurrency: int
    requests: int = 0
    errors: int = 0
    cancelled: int = 0
    server_died: str | None = None  # what showed it, and when
    error_samples: list[str] = field(default_factory=list)
    latency_p50_s: float = 0.0
    latency_p99_s: float = 0.0
    requests_by_model: dict[str, int] = field(default_factory=dict)
    rss_start_mib: float = 0.0
    rss_end_mib: float = 0.0

    @property
    def rss_growth(self) -> float:
        return self.rss_end_mib / self.rss_start_mib - 1 if self.rss_start_mib else 0.0

    def passed(self, max_rss_growth: float) -> bool:
        return (
            self.server_died is None
            and self.requests > 0
            and self.errors == 0
            and self.rss_growth < max_rss_growth
        )

    def summary(self) -> str:
        by_model = ", ".join(f"{name} {count}" for name, count in self.requests_by_model.items())
        died = f"SERVER DIED ({self.server_died}); " if self.server_died else ""
        return (
            f"{died}soak {self.duration_s:.0f} s, concurrency {self.concurrency}: "
            f"{self.requests} requests ({by_model}), {self.errors} errors, "
            f"{self.cancelled} cancelled by their client, "
            f"latency p50 {self.latency_p50_s:.2f} s, p99 {self.latency_p99_s:.2f} s, "
            f"server RSS {self.rss_start_mib:.0f} MiB after warm-up -> "
            f"{self.rss_end_mib:.0f} MiB at the end ({self.rss_growth:+.1%})"
        )


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, round(share * len(ordered) + 0.5 - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]


def tree_rss_mib(pid: int) -> float:
    """RSS of a process and all its descendants (stubs, EngineCores, workers)."""
    import psutil

    root = psutil.Process(pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def request_mix() -> list[tuple[str, dict, dict | None]]:
    """(model, fields, parameters) for every model x adapter x streaming combination."""
    from lora_client.requests import transcription_fields, vision_fields

    speech = _speech()
    image = _picture()
    mix = []
    for stream, adapter in itertools.product((False, True), ADAPTERS):
        parameters = {"lora_name": adapter} if adapter else None
        mix.append(
            (
                "whisper_lora",
                transcription_fields(speech, language="en", stream=stream, max_tokens=32),
                parameters,
            )
        )
        mix.append(
            (
                "qwen_vl_lora",
                vision_fields("Describe this image.", [image], stream=stream, max_tokens=24),
                parameters,
            )
        )
    return mix


def _speech() -> bytes:
    if not shutil.which("espeak-ng"):
        raise SystemExit("espeak-ng is missing: run `make setup`")
    wav = subprocess.run(["espeak-ng", "--stdout", SPEECH], check=True, capture_output=True)
    return wav.stdout


def _picture() -> bytes:
    from PIL import Image

    image = Image.new("RGB", (96, 64), (40, 120, 200))
    for x in range(0, 96, 6):
        image.putpixel((x, x % 64), (255, 255, 0))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def server_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def server_gone(grpc_url: str, pid: int) -> str | None:
    """Why the server can no longer answer (its process gone, or it stopped answering health
    checks), or None if it is up."""
    import tritonclient.grpc as grpcclient

    if not server_alive(pid):
        return "the server process is gone"
    try:
        live = grpcclient.InferenceServerClient(grpc_url).is_server_live(client_timeout=10)
    except Exception as err:  # refused, timed out: the same for a client
        return f"the server does not answer ({err})"
    return None if live else "the server reports itself not live"


def run(
    grpc_url: str,
    server_pid: int,
    *,
    duration_s: float,
    concurrency: int,
    warmup_s: float,
    models: tuple[str, ...] = MODELS,
    log=print,
    progress_every_s: float = 600,
) -> SoakReport:
    """Send the mix for warmup_s + duration_s; only requests after the warm-up are counted.
    Stops early, with `server_died` set, at the first sign that the server is gone."""
    from lora_client.requests import RequestError, grpc_stream

    mix = [item for item in request_mix() if item[0] in models]
    report = SoakReport(duration_s=duration_s, concurrency=concurrency)
    lock = threading.Lock()
    latencies: list[float] = []
    measuring = threading.Event()
    stop = threading.Event()
    started = time.monotonic()

    def died(sign: str) -> None:
        with lock:
            if report.server_died is None:
                report.server_died = f"{sign} after {time.monotonic() - started:.0f} s"
        stop.set()

    def one(model, fields, parameters, cancel: bool) -> str | None:
        try:
            replies = []
            for reply in grpc_stream(grpc_url, model, fields, parameters, timeout_s=120):
                replies.append(reply)
                if cancel:
                    return None  # leaving the stream cancels the request
        except (RequestError, OSError) as err:
            return str(err)
        except Exception as err:  # tritonclient's own errors (stream broken, timeout)
            return repr(err)
        if not replies or not replies[-1].final or not replies[-1].outputs.get("text_output"):
            return "no final response with text_output"
        return None

    def worker(offset: int) -> None:
        items = itertools.islice(itertools.cycle(mix), offset, None)
        for n, (model, fields, parameters) in enumerate(items, start=offset):
            if stop.is_set():
                return
            cancel = n % CANCEL_EVERY == CANCEL_EVERY - 1
            if cancel:
                fields = cancelled_variant(fields)
            counted = measuring.is_set()
            start = time.monotonic()
            error = one(model, fields, parameters, cancel)
            elapsed = time.monotonic() - start
            if error and (gone := server_gone(grpc_url, server_pid)):
                died(f"{gone}; a {model} request got: {error}")
                return
            if not counted:  # started during the warm-up
                continue
            with lock:
                report.requests += 1
                report.requests_by_model[model] = report.requests_by_model.get(model, 0) + 1
                if cancel and not error:
                    report.cancelled += 1
                elif not error:
                    latencies.append(elapsed)
                else:
                    report.errors += 1
                    if len(report.error_samples) < 10:
                        report.error_samples.append(f"{model} {parameters}: {error}")

    threads = [
        threading.Thread(target=worker, args=(i * 5,), daemon=True) for i in range(concurrency)
    ]
    for thread in threads:
        thread.start()
    log(f"warming up for {warmup_s:g} s ...")
    if not _wait(stop, warmup_s, server_pid, died):
        report.rss_start_mib = tree_rss_mib(server_pid)
        measuring.set()
        log(f"soaking for {duration_s:g} s with {concurrency} workers ...")
        measured_from = time.monotonic()
        end = measured_from + duration_s
        while time.monotonic() < end:
            if _wait(stop, min(progress_every_s, end - time.monotonic()), server_pid, died):
                break
            with lock:
                so_far = replace(
                    report,
                    duration_s=time.monotonic() - measured_from,
                    requests_by_model=dict(report.requests_by_model),
                    **latency_figures(latencies),
                )
            so_far.rss_end_mib = tree_rss_mib(server_pid)
            log(f"so far: {so_far.summary()}")
    stop.set()
    for thread in threads:
        thread.join(timeout=150)
    report.rss_end_mib = tree_rss_mib(server_pid) if server_alive(server_pid) else 0.0
    for name, value in latency_figures(latencies).items():
        setattr(report, name, value)
    return report


def latency_figures(latencies: list[float]) -> dict[str, float]:
    return {
        "latency_p50_s": percentile(latencies, 0.50),
        "latency_p99_s": percentile(latencies, 0.99),
    }


def cancelled_variant(fields: dict) -> dict:
    """The same request streamed and long enough to be cancelled while it runs."""
    sampling = json.loads(fields.get("sampling_parameters", "{}"))
    sampling.update(max_tokens=200, ignore_eos=True)
    return {**fields, "stream": True, "sampling_parameters": json.dumps(sampling)}


def _wait(stop: threading.Event, seconds: float, server_pid: int, died) -> bool:
    """Sleep up to `seconds`, checking the server every second; True if the soak stopped."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if stop.wait(min(1.0, max(deadline - time.monotonic(), 0))):
            return True
        if not server_alive(server_pid):
            died("the server process is gone")
            return True
    return stop.is_set()


def server_log_tail(path: Path | None, lines: int = 60) -> str:
    """The end of the server's log, where Triton prints a crash's signal and stack."""
    if path is None or not path.is_file():
        return "(no server log: pass --server-log)"
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def _start_server():
    """A tritonserver of our own. Under heavy load Triton 2.51 has been seen to wait forever on
    a stub whose initialize had returned (tests/conftest.py): start over once."""
    from lora_serving.launcher import REPO_ROOT, TritonServer

    for attempt in (1, 2):
        server = TritonServer(
            REPO_ROOT / "model_repository",
            http=_free_port(),
            grpc=_free_port(),
            metrics=_free_port(),
            log_path=Path("/tmp") / f"soak-tritonserver-{int(time.time())}.log",
        )
        print(f"starting tritonserver (log: {server.log_path}) ...", flush=True)
        try:
            server.wait_ready(timeout_s=480)
            return server
        except TimeoutError:
            server.stop()
            if attempt == 2:
                raise
            print("tritonserver start stalled; starting over", flush=True)
        except BaseException:
            server.stop()
            raise


def _interrupt(*_):
    raise KeyboardInterrupt


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=1800, help="seconds measured")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--warmup", type=float, default=60, help="seconds before measuring")
    parser.add_argument("--max-rss-growth", type=float, default=0.05)
    parser.add_argument("--grpc-url", help="a running server (needs --server-pid)")
    parser.add_argument("--server-pid", type=int, help="tritonserver's pid, for its RSS")
    parser.add_argument("--server-log", type=Path, help="its log, printed if it dies")
    parser.add_argument("--report", type=Path, help="also write the figures as JSON here")
    parser.add_argument(
        "--progress-every", type=float, default=600, help="seconds between interim figures"
    )
    args = parser.parse_args(argv)
    if bool(args.grpc_url) != bool(args.server_pid):
        parser.error("--grpc-url and --server-pid go together")

    server = None
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it (and its server) like Ctrl-C
    try:
        if args.grpc_url:
            grpc_url, pid, log_path = args.grpc_url, args.server_pid, args.server_log
        else:
            server = _start_server()
            grpc_url, pid = f"127.0.0.1:{server.grpc}", server.process.pid
            log_path = server.log_path
        report = run(
            grpc_url,
            pid,
            duration_s=args.duration,
            concurrency=args.concurrency,
            warmup_s=args.warmup,
            log=lambda line: print(line, flush=True),
            progress_every_s=args.progress_every,
        )
    finally:
        if server is not None:
            server.stop()
    print(report.summary())
    for sample in report.error_samples:
        print(f"  error: {sample}")
    if report.server_died:
        print(f"the server died; the end of its log ({log_path}):\n{server_log_tail(log_path)}")
    if args.report:
        args.report.write_text(
            json.dumps({**asdict(report), "rss_growth": report.rss_growth}, indent=2)
        )
    if report.server_died:
        return 2
    return 0 if report.passed(args.max_rss_growth) else 1


if __name__ == "__main__":
    sys.exit(main())
