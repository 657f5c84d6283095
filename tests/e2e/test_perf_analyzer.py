"""perf_analyzer (the 2.51 binary laid out by setup) drives both models with adapters mixed
round-robin through the `lora_name` input tensor, over a gRPC stream."""

import pytest
import requests

from lora_tools.bench import perf_data
from lora_tools.bench.perf_analyzer import run_perf_analyzer

ADAPTERS = [None, "alpha", "beta"]


def success_count(triton_server, model: str) -> float:
    text = requests.get(f"http://127.0.0.1:{triton_server.metrics}/metrics", timeout=10).text
    prefix = f'nv_inference_request_success{{model="{model}",version="1"}}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


@pytest.mark.parametrize(
    "model, make_data",
    [
        ("whisper_lora", lambda: perf_data.whisper_input_data(ADAPTERS, seconds=3, max_tokens=8)),
        ("qwen_vl_lora", lambda: perf_data.qwen_input_data(ADAPTERS, max_tokens=8)),
    ],
)
def test_perf_analyzer_mixes_adapters(triton_server, grpc_url, tmp_path, model, make_data):
    data = perf_data.write(make_data(), tmp_path / "input.json")
    before = success_count(triton_server, model)
    row = run_perf_analyzer(model, data, grpc_url=grpc_url, concurrency=2, requests_per_window=6)
    assert row["Inferences/Second"] > 0
    assert row["p50 latency"] > 0
    assert success_count(triton_server, model) - before >= 3 * 6  # >= 3 windows were measured
