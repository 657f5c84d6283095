"""The soak report's arithmetic and verdict (the soak itself runs in tests/e2e/test_soak.py)."""

from lora_tools.soak import SoakReport, percentile


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.50) == 50
    assert percentile(values, 0.99) == 99
    assert percentile([3.0], 0.99) == 3
    assert percentile([], 0.99) == 0


def test_report_fails_on_errors_or_rss_growth():
    good = SoakReport(duration_s=60, concurrency=2, requests=10, rss_start_mib=1000)
    good.rss_end_mib = 1040
    assert good.passed(0.05) and f"{good.rss_growth:+.1%}" == "+4.0%"
    grown = SoakReport(duration_s=60, concurrency=2, requests=10, rss_start_mib=1000)
    grown.rss_end_mib = 1050
    assert not grown.passed(0.05)
    failed = SoakReport(duration_s=60, concurrency=2, requests=10, errors=1, rss_start_mib=1000)
    failed.rss_end_mib = 1000
    assert not failed.passed(0.05)
    assert not SoakReport(duration_s=60, concurrency=2).passed(0.05)  # nothing sent


def test_summary_names_every_figure():
    report = SoakReport(
        duration_s=600, concurrency=4, requests=12, requests_by_model={"whisper_lora": 12}
    )
    report.rss_start_mib, report.rss_end_mib = 8000, 8100
    line = report.summary()
    for part in ("600 s", "concurrency 4", "12 requests", "0 errors", "p99", "8000 MiB", "+1.2%"):
        assert part in line, part


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_dead_server_stops_the_soak_at_once_with_its_log(tmp_path, capsys):
    """The server's process gone: the soak stops within seconds, not after --duration, prints
    the crash stack from the server's log and exits 2."""
    import subprocess
    import time

    from lora_tools import soak

    server = subprocess.Popen(["sleep", "60"])
    server.kill()
    server.wait()
    log = tmp_path / "tritonserver.log"
    log.write_text("serving\nSignal (11) received.\n 2# TRITONBACKEND_ResponseFactoryIsCancelled\n")
    started = time.monotonic()
    code = soak.main(
        [
            f"--grpc-url=127.0.0.1:{_closed_port()}",
            f"--server-pid={server.pid}",
            f"--server-log={log}",
            "--duration=600",
            "--warmup=1",
            "--concurrency=2",
        ]
    )
    assert code == 2
    assert time.monotonic() - started < 30
    out = capsys.readouterr().out
    assert "SERVER DIED (the server process is gone" in out
    assert "TRITONBACKEND_ResponseFactoryIsCancelled" in out


def test_a_server_that_stops_answering_counts_as_dead():
    import subprocess

    from lora_tools import soak

    server = subprocess.Popen(["sleep", "60"])  # alive, but nothing listens on the port
    try:
        report = soak.run(
            f"127.0.0.1:{_closed_port()}",
            server.pid,
            duration_s=600,
            concurrency=2,
            warmup_s=0.5,
            models=("qwen_vl_lora",),
        )
    finally:
        server.kill()
    assert report.server_died and "does not answer" in report.server_died, report.server_died
    assert not report.passed(0.05)
    assert report.summary().startswith("SERVER DIED")
