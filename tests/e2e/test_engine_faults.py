"""A bad day for the process tree, on a tritonserver of this module's own (whisper_lora only), so
the shared server is not disturbed: the engine process killed mid-request, then SIGTERM while
requests stream.

- Engine death: the request in flight ends with UNAVAILABLE at once; the model unloads itself,
  so Triton's readiness endpoint reports it not ready and refuses new requests (no hang);
  loading it through the repository API starts a new engine and it serves again.
- SIGTERM: requests in flight finish or end with an error (none hangs), and tritonserver, the
  stub, the EngineCore and its workers are all gone afterwards, without anyone's SIGKILL.

Two engine starts in all (the server's and the reload), ~1-4 minutes on 2 busy cores.
"""

import json
import signal
import threading
import time

import psutil
import pytest
import tritonclient.grpc as grpcclient
from lora_client.requests import RequestError, grpc_stream

from tests.conftest import start_triton
from tests.e2e.triton_calls import grpc_one, sampling

MODEL = "whisper_lora"
EXIT_TIMEOUT_S = 120  # Triton waits up to 30 s for in-flight requests, then unloads models


@pytest.fixture(scope="module")
def own_server(demo_models, tmp_path_factory):
    server = start_triton(tmp_path_factory, "faults", [f"--load-model={MODEL}"])
    try:
        yield server
    finally:
        server.stop()  # a no-op once the SIGTERM test has stopped it
        print(f"fault-test tritonserver log: {server.log_path}")


@pytest.fixture(scope="module")
def url(own_server) -> str:
    return f"127.0.0.1:{own_server.grpc}"


@pytest.fixture(scope="module")
def short(speech) -> dict:
    return {
        "audio_file": speech("Good morning.").read_bytes(),
        "language": "en",
        "sampling_parameters": sampling(max_tokens=8),
    }


def long_request(fields: dict, stream: bool = False) -> dict:
    """Runs for seconds: 400 tokens, end of text ignored."""
    long = {**fields, "sampling_parameters": json.dumps({"max_tokens": 400, "ignore_eos": True})}
    return {**long, "stream": True} if stream else long


def stub_of(server) -> psutil.Process:
    stubs = [
        child
        for child in psutil.Process(server.process.pid).children()
        if "triton_python_backend_stub" in " ".join(child.cmdline())
    ]
    assert len(stubs) == 1, stubs
    return stubs[0]


def engine_cores(stub: psutil.Process) -> list[psutil.Process]:
    return [p for p in stub.children(recursive=True) if p.name() == "VLLM::EngineCore"]


def in_background(call, *args) -> tuple[threading.Thread, dict]:
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(outcome=call(*args)), daemon=True)
    thread.start()
    return thread, result


def test_engine_death_makes_the_model_not_ready_and_a_reload_recovers_it(own_server, url, short):
    client = grpcclient.InferenceServerClient(url)
    assert grpc_one(url, MODEL, short).error is None
    # Our vLLM plugin armed the EngineCore to die with the stub (see the SIGTERM test).
    assert "die_with_parent" in own_server.log_path.read_text(errors="replace")
    stub = stub_of(own_server)
    [engine] = engine_cores(stub)

    running, result = in_background(grpc_one, url, MODEL, long_request(short))
    time.sleep(2)  # let it reach the engine
    engine.kill()

    running.join(30)
    assert not running.is_alive(), "the request in flight hangs after the engine died"
    assert "the engine has failed" in result["outcome"].error
    deadline = time.monotonic() + 30
    while client.is_model_ready(MODEL):
        assert time.monotonic() < deadline, "the model still reports ready without an engine"
        time.sleep(0.5)
    started = time.monotonic()
    refused = grpc_one(url, MODEL, short)
    assert f"'{MODEL}' has no available versions" in refused.error
    assert time.monotonic() - started < 5
    assert client.is_server_live()
    stub.wait(60)  # the old stub and everything under it exit

    client.load_model(MODEL)  # the repository API: a new stub, a new engine
    assert client.is_model_ready(MODEL)
    assert "good morning" in grpc_one(url, MODEL, short).text.lower()


def test_sigterm_with_requests_in_flight_leaves_nothing_running(own_server, url, short):
    tree = [psutil.Process(own_server.process.pid), *stub_of(own_server).children(recursive=True)]
    tree.append(stub_of(own_server))
    assert engine_cores(stub_of(own_server)), "no engine to watch"
    replies: list[list] = [[] for _ in range(3)]

    def stream(index: int):
        try:
            for reply in grpc_stream(url, MODEL, long_request(short, stream=True), timeout_s=90):
                replies[index].append(reply)
        except RequestError as err:
            return str(err)
        except Exception as err:  # the connection closing under it is a clean end, too
            return repr(err)
        return "finished" if replies[index][-1].final else "no final response"

    streams = [in_background(stream, i) for i in range(3)]
    deadline = time.monotonic() + 60
    while not all(replies):
        assert time.monotonic() < deadline, "the streams never started"
        time.sleep(0.2)

    own_server.process.send_signal(signal.SIGTERM)
    for thread, _ in streams:
        thread.join(EXIT_TIMEOUT_S)
        assert not thread.is_alive(), "a request in flight hangs after SIGTERM"
    outcomes = [result["outcome"] for _, result in streams]
    assert all(o == "finished" or "UNAVAILABLE" in o or "error" in o.lower() for o in outcomes)
    own_server.process.wait(EXIT_TIMEOUT_S)
    gone, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, f"left running after SIGTERM: {[(p.pid, p.name()) for p in alive]}"
    log = own_server.log_path.read_text(errors="replace")
    assert "Segfault" not in log and "Exit timeout expired" not in log, log[-4000:]
