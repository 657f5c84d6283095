"""The soak report's arithmetic and verdict (the soak itself runs in tests/e2e/test_soak.py)."""

from lora_serving.soak import SoakReport, percentile


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
