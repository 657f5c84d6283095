"""A short soak on the shared server: `make soak`'s mix (both models; base, alpha, beta; streamed
and not) from two workers for 30 s after a 10 s warm-up: no errors, RSS growth under 5 %.
The 10-minute run is `make soak` (docs/reliability.md)."""

from lora_tools import soak


def test_short_soak_has_no_errors_and_no_rss_growth(grpc_url, triton_server):
    report = soak.run(
        grpc_url, triton_server.process.pid, duration_s=30, concurrency=2, warmup_s=10
    )
    print(report.summary())
    assert report.errors == 0, report.error_samples
    assert set(report.requests_by_model) == set(soak.MODELS), report.requests_by_model
    assert report.rss_growth < 0.05, report.summary()
