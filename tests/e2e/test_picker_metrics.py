"""Conformance of the front's /metrics with the endpoint picker's model-server protocol, on the
shared tritonserver: lora-openai runs as `make serve` starts it, and its /metrics is read
exactly as llm-d Router v0.10.0 reads it (lora_tools.bench.picker: first series of each
gauge, the LoRA series with the largest value, comma split, max_lora as int, queue / running
as int, KV usage as float) every 50 ms, the picker's default scrape period, while requests
for adapters of both models run through the front, and after they end.

The requests are long on purpose: on two busy cores a scrape can take seconds, and a short
request (a few seconds of Whisper decoding) may start and end between two of them. Two Qwen
chats generate 3500 tokens each (end of text ignored, ~20 s); the transcription, sent once both
run, has timestamps over two windows, which are decoded one after the other."""

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from lora_tools.bench.picker import EndpointMetrics, read_endpoint_metrics
from tests.conftest import REPO, _test_models, only_with_model
from tests.e2e.test_openai_api import front_on

MODEL = "whisper_lora"
QWEN = "qwen_vl_lora"
CHATS = [f"{QWEN}/alpha", f"{QWEN}/beta"]
TRANSCRIPTION = f"{MODEL}/cross_kv"
IDS = [*CHATS, TRANSCRIPTION]
CHAT_TOKENS = 3500
# About 25 s of speech, said twice: two windows.
TEXT = (
    "Routing a request to a replica that already holds its adapter saves a load and a batch "
    "slot. The endpoint picker reads every replica's metrics, prefers the replica whose engine "
    "runs the adapter now, and keeps away from replicas whose queues are long. Three adapters "
    "share this batch while the test reads the metrics twenty times a second."
)

pytestmark = [only_with_model(MODEL), only_with_model(QWEN)]


@pytest.fixture(scope="module")
def front(triton_server, tmp_path_factory):
    with front_on(triton_server, tmp_path_factory.mktemp("picker")) as server:
        yield server.url


def scrape(url: str) -> EndpointMetrics:
    # On two busy cores a scrape has taken up to ~3 s (the front shares a core with an engine).
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return read_endpoint_metrics(response.read().decode())


def loaded_max_loras() -> int:
    """The slots per engine the front should publish: the smallest of the loaded models'."""
    models = _test_models()
    return min(
        json.loads((REPO / "model_repository" / m / "1" / "model.json").read_text())["max_loras"]
        for m in ("whisper_lora", "qwen_vl_lora")
        if "*" in models or m in models
    )


def wait_idle(url: str, timeout_s: float = 30) -> EndpointMetrics:
    deadline = time.monotonic() + timeout_s
    while True:
        view = scrape(url)
        idle = not (view.active_models or view.waiting_models)
        if idle and view.running_requests_size == 0 and view.waiting_queue_size == 0:
            return view
        assert time.monotonic() < deadline, f"still busy after {timeout_s} s: {view}"
        time.sleep(0.05)


def test_running_adapters_are_the_engines_own_while_three_adapters_run(front, speech):
    wav = speech(f"{TEXT} {TEXT}").read_bytes()
    before = wait_idle(front)
    assert before.max_active_models == loaded_max_loras()

    def chat(model_id: str) -> str:
        body = {
            "model": model_id,
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": CHAT_TOKENS,
            "ignore_eos": True,
        }
        response = httpx.post(f"{front}/v1/chat/completions", json=body, timeout=300)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]["content"]

    def transcribe(model_id: str) -> str:
        response = httpx.post(
            f"{front}/v1/audio/transcriptions",
            files={"file": ("speech.wav", wav, "audio/wav")},
            data={"model": model_id, "language": "en", "response_format": "verbose_json"},
            timeout=300,
        )
        assert response.status_code == 200, response.text
        return response.json()["text"]

    views: list[EndpointMetrics] = []
    started = time.monotonic()
    seen: list[tuple[float, list[str]]] = []  # (seconds, active ids) at each change, for a failure

    def scrape_and_note() -> EndpointMetrics:
        view = scrape(front)
        if not seen or seen[-1][1] != sorted(view.active_models):
            seen.append((round(time.monotonic() - started, 2), sorted(view.active_models)))
        return view

    with ThreadPoolExecutor(len(IDS)) as pool:
        futures = [pool.submit(chat, model_id) for model_id in CHATS]
        deadline = time.monotonic() + 60
        while not set(CHATS) <= (views[-1].active_models if views else set()):
            assert time.monotonic() < deadline, seen
            assert not any(f.done() for f in futures), f"a chat ended before both ran: {seen}"
            views.append(scrape_and_note())
            time.sleep(0.05)
        futures.append(pool.submit(transcribe, TRANSCRIPTION))
        while not all(f.done() for f in futures):
            views.append(scrape_and_note())
            time.sleep(0.05)
        texts = [f.result() for f in futures]
    assert all(texts), texts

    assert len(views) > 10, "the requests ended before /metrics was read often"
    for view in views:
        assert view.active_models | view.waiting_models <= set(IDS), view
        assert view.max_active_models == before.max_active_models
        assert 0.0 <= view.kv_cache_usage_percent <= 1.0
        assert view.running_requests_size >= len(view.active_models)
        assert view.waiting_queue_size >= len(view.waiting_models)
    # Both chats ran in one Qwen batch (the wait above), and the transcription ran beside them:
    # ids of both models in one view, every count the engines' own.
    together = [v for v in views if v.active_models == set(IDS)]
    assert together, seen
    assert min(v.running_requests_size for v in together) >= len(IDS)
    assert max(v.kv_cache_usage_percent for v in views) > 0.0

    # Finished requests leave the lists (and the counts) at the engines' next statistics.
    after = wait_idle(front, timeout_s=10)
    assert after.active_models == frozenset() and after.waiting_models == frozenset()
