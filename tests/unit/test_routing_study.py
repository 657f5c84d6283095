"""The routing study's pure parts (lora_tools.bench.routing): the replayed trace, the two
policies, the summary. The study itself starts two servers: `make routing-study`."""

from collections import Counter

import pytest

from lora_tools.bench.picker import EndpointMetrics
from lora_tools.bench.routing import (
    Outcome,
    PickerScoring,
    PickerWarmSlots,
    PickerWithRunning,
    PolicyResult,
    RoundRobin,
    StudyConfig,
    form,
    make_trace,
    zipf_weights,
)


def test_the_trace_is_reproducible_skewed_and_poisson():
    config = StudyConfig(adapters=12, requests=2000, rate_rps=2.0, zipf_s=1.0, seed=3)
    trace = make_trace(config)
    assert trace == make_trace(config)  # every policy replays the same requests
    assert trace != make_trace(StudyConfig(requests=2000, seed=4))
    counts = Counter(item.adapter for item in trace)
    weights = zipf_weights(12, 1.0)
    assert weights[0] / weights[1] == pytest.approx(2.0) and sum(weights) == pytest.approx(1.0)
    assert counts["r00"] / len(trace) == pytest.approx(weights[0], abs=0.03)
    assert counts["r00"] > counts["r05"] > counts["r11"] > 0
    gaps = [b.at_s - a.at_s for a, b in zip(trace, trace[1:], strict=False)]
    assert sum(gaps) / len(gaps) == pytest.approx(1 / config.rate_rps, rel=0.1)
    assert all(gap >= 0 for gap in gaps)


def view(active=(), queue=0) -> EndpointMetrics:
    return EndpointMetrics(queue, len(active), 0.1, frozenset(active), frozenset(), 2)


def test_round_robin_ignores_the_metrics_and_the_picker_follows_them():
    rr = RoundRobin(2, seed=0)
    assert [rr.choose("m/a", [view(), view()]) for _ in range(4)] == [0, 1, 0, 1]
    picker = PickerScoring(2, seed=0)
    views = [view(active=["m/x", "m/y"]), view(active=["m/a"])]
    assert {picker.choose("m/a", views) for _ in range(10)} == {1}  # 1 + 1 + 1 vs 1 + 1 + 0
    views = [view(active=["m/x"]), view(active=["m/a"], queue=3)]
    assert picker.choose("m/a", views) == 0  # the queue outweighs 0.2 of affinity
    ties = {picker.choose("m/a", [view(), view()]) for _ in range(50)}
    assert ties == {0, 1}  # max-score-picker breaks ties at random
    # Running requests count only with the running-requests-size-scorer: a replica running
    # the adapter three times over loses to an idle one with room for it.
    views = [view(active=["m/x"]), view(active=["m/a", "m/a2"])]
    views[1] = EndpointMetrics(0, 3, 0.1, frozenset(["m/a"]), frozenset(), 2)
    assert picker.choose("m/a", views) == 1  # 1 + 0.9 + 1 beats 1 + 0.9 + 0.8
    assert PickerWithRunning(2, seed=0).choose("m/a", views) == 0  # + 1 vs + 0


def test_the_what_if_policy_counts_adapters_in_slots_as_running():
    views = [view(active=["m/x"]), view(active=["m/y"])]
    warm = PickerWarmSlots(2, seed=0)
    assert {warm.choose("m/a", views, [frozenset(), frozenset({"m/a"})]) for _ in range(5)} == {1}
    assert {warm.choose("m/a", views, None) for _ in range(20)} == {0, 1}  # no listing: a tie


def test_requests_decode_once_without_fallback():
    fields = form("whisper_lora/r01", 32)
    assert fields["model"] == "whisper_lora/r01" and fields["max_tokens"] == "32"
    for check in ("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold"):
        assert fields[check] == "null"


def test_summary():
    outcomes = [
        Outcome("r00", 0, 0.0, 1.0, True, True),
        Outcome("r01", 1, 0.5, 3.0, True, False),
        Outcome("r00", 0, 1.0, 2.0, False, False, "503"),
    ]
    summary = PolicyResult("picker", outcomes, slot_loads=3, cache_loads=1, wall_s=4.0).summary()
    assert summary["errors"] == 1 and summary["requests_per_replica"] == [2, 1]
    assert summary["slot_loads_per_request"] == 1.0
    assert summary["p50_s"] == 2.0 and summary["throughput_rps"] == 0.5
    assert summary["affinity_hits"] == pytest.approx(1 / 3)
    # In flight when each was sent: the first found nothing, the second one request on the
    # other replica, the third one on each (the first ends as it is sent).
    assert summary["sent_to_busier_replica"] == 0.0
    assert summary["in_flight_difference"] == pytest.approx((0 - 1 + 0) / 3)
    busy = outcomes + [Outcome("r02", 1, 3.1, 1.0, True, False)]  # only r01 runs then
    assert PolicyResult("rr", busy, 0, 0, 4.0).summary()["sent_to_busier_replica"] == 0.25
