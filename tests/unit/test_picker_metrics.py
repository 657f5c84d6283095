"""The front's /metrics in the endpoint picker's protocol (no Triton, no server): Triton's
lora_* series -> ServerLoad -> vllm:* exposition, read back as llm-d Router v0.10.0 reads it
(lora_tools.bench.picker), and that reader's scoring."""

import asyncio

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from lora_openai.app import FrontSettings, create_app
from lora_openai.engine_load import ModelLoad, ServerLoad, TritonLoadReader, parse_triton_metrics
from lora_openai.errors import OpenAIError
from lora_openai.picker_metrics import render
from lora_tools.bench.picker import (
    EndpointMetrics,
    MetricMissing,
    lora_affinity_score,
    pick,
    queue_scores,
    read_endpoint_metrics,
    scores,
)

# What Triton's metrics endpoint shows while a model reloads (two stubs of whisper_lora, the
# old one closed: its gauges are back at 0) and qwen_vl_lora serves with fewer slots.
TRITON_TEXT = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="whisper_lora",version="1"} 12
# HELP lora_requests_total Generation jobs (batch rows) by outcome
# TYPE lora_requests_total counter
lora_requests_total{adapter="alpha",model="whisper_lora",outcome="success",stub_pid="11"} 4
# HELP lora_requests_running Engine requests running
# TYPE lora_requests_running gauge
lora_requests_running{adapter="alpha",model="whisper_lora",stub_pid="11"} 2
lora_requests_running{adapter="(base)",model="whisper_lora",stub_pid="11"} 1
lora_requests_running{adapter="beta",model="whisper_lora",stub_pid="11"} 0
lora_requests_running{adapter="alpha",model="whisper_lora",stub_pid="7"} 0
lora_requests_running{adapter="alpha",model="qwen_vl_lora",stub_pid="22"} 1
# HELP lora_requests_waiting Engine requests waiting to be scheduled
# TYPE lora_requests_waiting gauge
lora_requests_waiting{adapter="beta",model="whisper_lora",stub_pid="11"} 3
lora_requests_waiting{adapter="(base)",model="whisper_lora",stub_pid="11"} 0
lora_requests_waiting{adapter="(unknown)",model="qwen_vl_lora",stub_pid="22"} 1
# HELP lora_kv_cache_usage_perc KV cache usage, 1 = full
# TYPE lora_kv_cache_usage_perc gauge
lora_kv_cache_usage_perc{model="whisper_lora",stub_pid="11"} 0.25
lora_kv_cache_usage_perc{model="whisper_lora",stub_pid="7"} 0
lora_kv_cache_usage_perc{model="qwen_vl_lora",stub_pid="22"} 0.5
# HELP lora_max_loras Adapters one batch can use (LoRA slots)
# TYPE lora_max_loras gauge
lora_max_loras{model="whisper_lora",stub_pid="11"} 4
lora_max_loras{model="whisper_lora",stub_pid="7"} 0
lora_max_loras{model="qwen_vl_lora",stub_pid="22"} 3
"""


def test_triton_series_become_one_load_summed_over_stubs():
    load = parse_triton_metrics(TRITON_TEXT)
    assert set(load.models) == {"whisper_lora", "qwen_vl_lora"}
    assert load.models["whisper_lora"].running == {"alpha": 2, "(base)": 1, "beta": 0}
    assert load.models["whisper_lora"].max_loras == 4
    assert load.num_running == 4 and load.num_waiting == 4
    assert load.kv_cache_usage == 0.5  # the fuller engine
    assert load.max_lora == 3  # the smaller engine's slots
    assert load.adapters("running") == ["qwen_vl_lora/alpha", "whisper_lora/alpha"]
    assert load.adapters("waiting") == ["whisper_lora/beta"]  # no "(unknown)", no "(base)"


def test_exposition_is_what_the_picker_reads():
    text = render(parse_triton_metrics(TRITON_TEXT), updated_at=1_767_000_000.5).decode()
    # One series per family: the picker reads a gauge's first series, the LoRA series with the
    # largest value.
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {name: (f.type, len(f.samples)) for name, f in families.items()} == {
        "vllm:num_requests_waiting": ("gauge", 1),
        "vllm:num_requests_running": ("gauge", 1),
        "vllm:kv_cache_usage_perc": ("gauge", 1),
        "vllm:lora_requests_info": ("gauge", 1),
    }
    info = families["vllm:lora_requests_info"].samples[0]
    assert info.value == 1_767_000_000.5
    assert info.labels == {
        "max_lora": "3",
        "running_lora_adapters": "qwen_vl_lora/alpha,whisper_lora/alpha",
        "waiting_lora_adapters": "whisper_lora/beta",
    }
    assert read_endpoint_metrics(text) == EndpointMetrics(
        waiting_queue_size=4,
        running_requests_size=4,
        kv_cache_usage_percent=0.5,
        active_models=frozenset({"qwen_vl_lora/alpha", "whisper_lora/alpha"}),
        waiting_models=frozenset({"whisper_lora/beta"}),
        max_active_models=3,
    )


def test_idle_and_lora_less_servers():
    idle = render(ServerLoad({"whisper_lora": ModelLoad(max_loras=4)}), 5.0).decode()
    info = {f.name: f for f in text_string_to_metric_families(idle)}["vllm:lora_requests_info"]
    assert [(s.labels, s.value) for s in info.samples] == [
        ({"max_lora": "4", "running_lora_adapters": "", "waiting_lora_adapters": ""}, 5.0)
    ]
    view = read_endpoint_metrics(idle)
    assert (view.active_models, view.waiting_models, view.max_active_models) == (
        frozenset(),
        frozenset(),
        4,
    )
    # Like vLLM without LoRA: no vllm:lora_requests_info at all; the picker skips it.
    plain = render(ServerLoad({"m": ModelLoad()}), 5.0).decode()
    assert "vllm:lora_requests_info" not in plain
    assert read_endpoint_metrics(plain).max_active_models == 0


def test_the_picker_reads_the_latest_lora_series_and_trims_names():
    text = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 3.0
vllm:num_requests_waiting{model_name="b"} 9.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running 2.9
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc 0.125
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="8",running_lora_adapters="old",waiting_lora_adapters=""} 100.0
vllm:lora_requests_info{max_lora="8",running_lora_adapters="a1, a2,",waiting_lora_adapters="w"} 300
vllm:lora_requests_info{max_lora="8",running_lora_adapters="older",waiting_lora_adapters=""} 200.0
"""
    view = read_endpoint_metrics(text)
    assert view.waiting_queue_size == 3  # the first series, as the picker takes it
    assert view.running_requests_size == 2  # Go's int(float64)
    assert view.active_models == {"a1", "a2"} and view.waiting_models == {"w"}
    with pytest.raises(MetricMissing, match="vllm:kv_cache_usage_perc"):
        read_endpoint_metrics(text.replace("vllm:kv_cache_usage_perc", "other"))
    with pytest.raises(ValueError):
        read_endpoint_metrics(text.replace('max_lora="8"', 'max_lora="8.0"'))


def view(queue=0, active=(), waiting=(), max_lora=2, kv=0.0) -> EndpointMetrics:
    return EndpointMetrics(queue, 0, kv, frozenset(active), frozenset(waiting), max_lora)


@pytest.mark.parametrize(
    ("endpoint", "score"),
    [
        (view(active=["t", "x"]), 1.0),  # active, even when full
        (view(active=["x"]), 0.8),  # room for one more
        (view(active=["x"], waiting=["t"]), 0.6),  # full, target already waiting
        (view(active=["x", "y"]), 0.0),  # full, target neither active nor waiting
        (view(active=["x"], waiting=["t"], max_lora=3), 0.8),  # room wins over waiting
    ],
)
def test_lora_affinity_scores(endpoint, score):
    assert lora_affinity_score("t", endpoint) == score


def test_queue_scores_and_the_weighted_pick():
    endpoints = {"a": view(queue=4), "b": view(queue=0), "c": view(queue=2)}
    assert queue_scores(endpoints) == {"a": 0.0, "b": 1.0, "c": 0.5}
    assert set(queue_scores({"a": view(1), "b": view(1)}).values()) == {1.0}
    # Affinity against a queue: b holds the adapter, a has one request less waiting.
    endpoints = {"a": view(queue=0, active=["x", "y"]), "b": view(queue=1, active=["t", "y"])}
    assert scores("t", endpoints) == {"a": 1.0 + 1.0 + 0.0, "b": 0.0 + 1.0 + 1.0}
    endpoints = {"a": view(queue=0, active=["x"]), "b": view(queue=1, active=["t"])}
    assert pick("t", endpoints) == "a"  # 1 + 1 + 0.8 beats 0 + 1 + 1
    assert pick("t", endpoints, {"queue-scorer": 0.1, "lora-affinity-scorer": 1.0}) == "b"


# ---- the route, through the real reader over a fake transport ---------------------------------
def triton_transport(texts: list[str], fetched: list[int]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        fetched.append(1)
        if not texts:
            return httpx.Response(503)
        return httpx.Response(200, text=texts[0])

    return httpx.MockTransport(handler)


def test_metrics_route_serves_the_protocol_and_503_without_triton():
    texts, fetched = [TRITON_TEXT], []

    def reader(url):
        return TritonLoadReader(url, max_age_s=0, transport=triton_transport(texts, fetched))

    app = create_app(FrontSettings(), load_reader_factory=reader)
    with TestClient(app) as client:
        response = client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert read_endpoint_metrics(response.text).active_models == {
            "qwen_vl_lora/alpha",
            "whisper_lora/alpha",
        }
        texts.clear()
        response = client.get("/metrics")
        assert response.status_code == 503
        assert "cannot be read" in response.json()["error"]["message"]


def test_reader_reuses_a_fresh_read_and_shares_one_read_between_scrapes():
    fetched, now = [], [100.0]
    reader = TritonLoadReader(
        "http://triton/metrics",
        max_age_s=0.05,
        clock=lambda: now[0],
        wall_clock=lambda: 1234.0,
        transport=triton_transport([TRITON_TEXT], fetched),
    )

    async def scrape_three_times():
        first, second = await asyncio.gather(reader.read(), reader.read())
        now[0] += 0.06
        third = await reader.read()
        await reader.close()
        return first, second, third

    first, second, third = asyncio.run(scrape_three_times())
    assert first is second and third is not first and len(fetched) == 2
    assert first.read_at == 1234.0 and first.load.num_running == 4


def test_reader_reports_an_unreachable_triton():
    reader = TritonLoadReader("http://triton/metrics", transport=triton_transport([], []))
    with pytest.raises(OpenAIError) as err:
        asyncio.run(reader.read())
    assert err.value.status == 503
