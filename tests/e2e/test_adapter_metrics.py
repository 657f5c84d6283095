"""Per-adapter metrics on Triton's Prometheus endpoint after a mixed run on qwen_vl_lora: the
counts, tokens and histogram samples per adapter are exactly what was sent."""

import re
import time
import urllib.request
from collections import Counter

from tests.e2e.test_adapter_fleet import MODEL, served
from tests.e2e.test_serving_stack import qwen_inputs
from tests.e2e.triton_calls import grpc_many, sampling

_LINE = re.compile(r"^(?P<name>[a-z_:]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def metrics_text(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def scrape(port: int) -> dict[tuple, float]:
    """(metric name, sorted label pairs) -> value, for our lora_* series, summed over the
    stub_pid label (each load of a model writes its own series)."""
    text = metrics_text(port)
    series: dict[tuple, float] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and match["name"].startswith("lora_"):
            pairs = re.findall(r'(\w+)="([^"]*)"', match["labels"])
            assert "stub_pid" in dict(pairs), line
            labels = tuple(sorted((k, v) for k, v in pairs if k != "stub_pid"))
            key = (match["name"], labels)
            series[key] = series.get(key, 0.0) + float(match["value"])
    return series


def value(series, name, **labels) -> float:
    return series.get((name, tuple(sorted({"model": MODEL, **labels}.items()))), 0.0)


def stub_pids(port: int, model: str) -> set[str]:
    text = metrics_text(port)
    return set(re.findall(rf'^lora_adapters\{{model="{model}",.*stub_pid="(\d+)"', text, re.M))


def test_metrics_count_what_each_adapter_was_sent(grpc_url, triton_server):
    # After a reload (tests/e2e/test_qwen2_5_variant.py) Triton unloads the old stub a few
    # seconds after the new one serves; its series leave /metrics with it.
    deadline = time.monotonic() + 120
    while len(stub_pids(triton_server.metrics, MODEL)) > 1 and time.monotonic() < deadline:
        time.sleep(1)
    assert len(stub_pids(triton_server.metrics, MODEL)) == 1
    before = scrape(triton_server.metrics)
    sent = {"alpha": 2, "beta": 3, None: 1}
    requests = [
        (qwen_inputs(), {"lora_name": name} if name else None)
        for name, count in sent.items()
        for _ in range(count)
    ]
    requests.append((qwen_inputs(), {"lora_name": "no_such_adapter"}))
    requests.append((qwen_inputs(sampling_parameters=sampling(temprature=0.5)), None))
    outcomes = grpc_many(grpc_url, MODEL, requests)
    assert [outcome.error is None for outcome in outcomes] == [True] * 6 + [False] * 2

    labels = [name or "(base)" for name, count in sent.items() for _ in range(count)]
    prompt_tokens, output_tokens = Counter(), Counter()
    for label, outcome in zip(labels, outcomes, strict=False):
        prompt_tokens[label] += outcome.outputs["num_input_tokens"][0]
        output_tokens[label] += outcome.outputs["num_output_tokens"][0]

    def delta(after, name, **label_values):
        return value(after, name, **label_values) - value(before, name, **label_values)

    expected = {}
    for label in ("alpha", "beta", "(base)"):
        count = labels.count(label)
        expected[("lora_requests_total", label, "success")] = count
        expected[("lora_prompt_tokens_total", label, None)] = prompt_tokens[label]
        expected[("lora_generation_tokens_total", label, None)] = output_tokens[label]
        expected[("lora_time_to_first_token_seconds_count", label, None)] = count
        expected[("lora_request_latency_seconds_count", label, None)] = count
    expected[("lora_requests_total", "(unknown)", "refused")] = 2

    deadline = time.monotonic() + 15  # the metrics thread applies events asynchronously
    while True:
        after = scrape(triton_server.metrics)
        got = {
            key: delta(after, key[0], adapter=key[1], **({"outcome": key[2]} if key[2] else {}))
            for key in expected
        }
        if got == expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert got == expected

    adapters = served(grpc_url)
    states = {state: value(after, "lora_adapters", state=state) for state in ("loaded", "cached")}
    states["registered"] = value(after, "lora_adapters", state="registered")
    assert sum(states.values()) == len(adapters), states
    for adapter in ("alpha", "beta", "(base)"):  # everything finished: back to zero
        assert value(after, "lora_requests_running", adapter=adapter) == 0
        assert ("lora_requests_waiting", (("adapter", adapter), ("model", MODEL))) in after
