"""Cancellation, timeouts and broken adapter files on the shared tritonserver.

- A gRPC stream cancelled mid-generation stops the engine's work for that request: vLLM's
  scheduler stops running it at once (lora_requests_running, read from the engine), its job is
  counted `cancelled`, its token count stops growing far short of max_tokens; the model serves.
- A request running past its timeout (the client's request timeout, bounded by
  serving.request_timeout_s) ends with an error naming the timeout, not a hang.
- Adapter files: the fleet serves private snapshots it has checked. Corrupting an adapter's
  folder in the root makes the rescan refuse the new files while the checked version keeps
  serving; deleting the folder removes the adapter (`unknown adapter`). Tampering with the
  snapshot the engine reads fails only that adapter's requests, with a message naming it.
"""

import json
import os
import queue
import shutil
import time

import pytest
import tritonclient.grpc as grpcclient
from lora_client.requests import infer_inputs

from tests.e2e.test_adapter_fleet import (
    PREFIX,
    ROOT,
    ask,
    clear_root,
    command,
    publish,
    qwen_adapters,
    reference,
    retract,
    served,
)
from tests.e2e.test_adapter_metrics import scrape
from tests.e2e.triton_calls import grpc_one, sampling

QWEN = "qwen_vl_lora"
WHISPER = "whisper_lora"
LONG_TOKENS = 3000  # ~a minute of generation for the tiny model if nobody stopped it


def series(triton_server, name: str, **labels) -> float:
    key = (name, tuple(sorted({"model": QWEN, **labels}.items())))
    return scrape(triton_server.metrics).get(key, 0.0)


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return result


# ---- cancellation --------------------------------------------------------------------------------
def test_a_cancelled_stream_stops_its_engine_work_and_the_model_keeps_serving(
    grpc_url, triton_server
):
    cancelled_before = series(
        triton_server, "lora_requests_total", adapter="alpha", outcome="cancelled"
    )
    tokens_before = series(triton_server, "lora_generation_tokens_total", adapter="alpha")
    fields = {
        "text_input": "Tell me a very long story.",
        "exclude_input_in_output": True,
        "stream": True,
        "sampling_parameters": sampling(max_tokens=LONG_TOKENS, ignore_eos=True),
    }
    client = grpcclient.InferenceServerClient(grpc_url)
    replies: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    client.async_stream_infer(
        QWEN, infer_inputs(grpcclient, fields), parameters={"lora_name": "alpha"}
    )
    for _ in range(5):  # generation is under way
        result, error = replies.get(timeout=120)
        assert error is None, error
    running = wait_for(
        lambda: series(triton_server, "lora_requests_running", adapter="alpha"),
        10,
        "the engine does not report the request running",
    )
    assert running == 1

    client.stop_stream(cancel_requests=True)
    cancelled_at = time.monotonic()
    wait_for(
        lambda: series(triton_server, "lora_requests_running", adapter="alpha") == 0,
        10,
        "the engine still runs the cancelled request",
    )
    stopped_after = time.monotonic() - cancelled_at
    wait_for(
        lambda: series(triton_server, "lora_requests_total", adapter="alpha", outcome="cancelled")
        == cancelled_before + 1,
        10,
        "the job was not counted as cancelled",
    )
    generated = series(triton_server, "lora_generation_tokens_total", adapter="alpha")
    time.sleep(3)
    assert series(triton_server, "lora_generation_tokens_total", adapter="alpha") == generated
    assert 5 <= generated - tokens_before < LONG_TOKENS / 2, generated - tokens_before
    assert stopped_after < 5, stopped_after
    assert ask(grpc_url, "alpha").error is None  # the model serves on


# ---- timeouts ------------------------------------------------------------------------------------
def test_a_request_past_its_timeout_ends_with_an_error_not_a_hang(grpc_url, speech):
    fields = {
        "audio_file": speech("Good morning.").read_bytes(),
        "language": "en",
        "sampling_parameters": json.dumps({"max_tokens": 400, "ignore_eos": True}),
    }
    client = grpcclient.InferenceServerClient(grpc_url)
    replies: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    started = time.monotonic()
    client.async_stream_infer(
        WHISPER, infer_inputs(grpcclient, fields), timeout=1_500_000
    )  # microseconds, as in Triton's protocol
    result, error = replies.get(timeout=60)
    elapsed = time.monotonic() - started
    client.stop_stream()
    assert error is not None and "request exceeded its 1.5 s timeout" in str(error), error
    assert elapsed < 15, elapsed
    short = {**fields, "sampling_parameters": sampling(max_tokens=8)}
    assert "good morning" in grpc_one(grpc_url, WHISPER, short).text.lower()


# ---- adapter files -------------------------------------------------------------------------------
@pytest.fixture
def faulty(grpc_url, demo_models, tmp_path):
    """(name, its built folder, its reference text) of an adapter served from the root."""
    clear_root()
    name = f"{PREFIX}_faulty"
    base = demo_models / "qwen2-vl-tiny"
    folder = qwen_adapters(base, tmp_path, [name], seed=41) / name
    publish(folder, name)
    command(grpc_url, "rescan")
    yield name, folder, reference(base, folder)
    retract(name)
    clear_root()
    command(grpc_url, "rescan")


def test_corrupted_adapter_files_are_refused_and_the_checked_version_keeps_serving(
    grpc_url, faulty
):
    name, _, expected = faulty
    assert ask(grpc_url, name).text == expected
    weights = ROOT / name / "adapter_model.safetensors"
    weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")  # a broken header
    report = command(grpc_url, "rescan")
    assert name in report["refused"], report
    assert served(grpc_url)[name]["version"] == 1  # still the checked one
    assert ask(grpc_url, name).text == expected
    assert ask(grpc_url, "beta").error is None

    shutil.rmtree(ROOT / name)
    command(grpc_url, "rescan")
    assert f"unknown adapter '{name}'" in ask(grpc_url, name).error
    assert ask(grpc_url, "alpha").error is None


def test_a_tampered_snapshot_fails_only_its_own_requests(grpc_url, faulty):
    name, _, expected = faulty
    assert ask(grpc_url, name).text == expected
    snapshot = served(grpc_url)[name]["snapshot"]
    weights = f"{snapshot}/adapter_model.safetensors"
    os.chmod(weights, 0o644)  # snapshot files are read-only: a deliberate tamper
    with open(weights, "r+b") as file:
        file.seek(100)
        file.write(b"\xff" * 64)
    failed = ask(grpc_url, name)
    assert f"adapter '{name}' cannot be served: its checked snapshot" in failed.error
    assert ask(grpc_url, "alpha").error is None and ask(grpc_url, None).error is None
    client = grpcclient.InferenceServerClient(grpc_url)
    assert client.is_model_ready(QWEN)

    command(grpc_url, f"load {name}")  # a fresh snapshot from the intact folder
    assert ask(grpc_url, name).text == expected
