"""A bad day for the process tree, on a tritonserver of this module's own (whisper_lora only), so
the shared server is not disturbed: responses racing cancel polls, the engine process killed
mid-request, then SIGTERM while requests stream.

- Response race (issue 19): with the cancel poll at 1 ms, many short streamed and plain
  requests, cancellations, timeouts and refusals at once. Before the fix tritonserver died with
  SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled within ~10 s (a poll reached a request
  whose FINAL response had been sent); now it serves them all.

- Engine death: the request in flight ends with UNAVAILABLE at once; the model unloads itself,
  so Triton's readiness endpoint reports it not ready and refuses new requests (no hang);
  loading it through the repository API starts a new engine and it serves again.
- SIGTERM: requests in flight finish or end with an error (none hangs), and tritonserver, the
  stub, the EngineCore and its workers are all gone afterwards, without anyone's SIGKILL.

Two engine starts in all (the server's and one reload), ~2-4 minutes on 2 busy cores.
"""

import itertools
import json
import queue
import shutil
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
import tritonclient.grpc as grpcclient
from lora_client.requests import RequestError, grpc_stream

from tests.conftest import start_triton
from tests.e2e.triton_calls import grpc_one, sampling

MODEL = "whisper_lora"
MODEL_DIR = Path(__file__).resolve().parents[2] / "model_repository" / MODEL
RACE_SECONDS = 30
RACE_CLIENTS = 16
CANCEL_WAIT_S = 20
EXIT_TIMEOUT_S = 120  # Triton waits up to 30 s for in-flight requests, then unloads models


@pytest.fixture(scope="module")
def own_server(demo_models, tmp_path_factory):
    repository = fast_cancel_poll_repository(tmp_path_factory.mktemp("faults_repo"), demo_models)
    server = start_triton(tmp_path_factory, "faults", [f"--load-model={MODEL}"], repository)
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


def fast_cancel_poll_repository(root: Path, demo_models) -> Path:
    """whisper_lora with its cancel poll at 1 ms: the poll then meets nearly every FINAL
    response on its way out, which is what made the rare crash certain. The server starts on
    it (rather than reloading the repository's model: one engine start fewer)."""
    model_json = json.loads((MODEL_DIR / "1" / "model.json").read_text())
    model_json["model"] = str(demo_models / "whisper-base")
    model_json["serving"]["adapters"]["roots"] = []
    model_json["serving"]["int8_model"] = str(demo_models / "whisper-base-int8")
    model_json["serving"]["cancel_poll_s"] = 0.001
    adapters = {name: str(demo_models / "whisper-adapters" / name) for name in ("alpha", "beta")}
    version = root / MODEL / "1"
    version.mkdir(parents=True)
    shutil.copy(MODEL_DIR / "config.pbtxt", root / MODEL / "config.pbtxt")
    shutil.copy(MODEL_DIR / "1" / "model.py", version / "model.py")
    (version / "model.json").write_text(json.dumps(model_json))
    (version / "multi_lora.json").write_text(json.dumps(adapters))
    return root


def cancelled_after_first_reply(url: str, fields: dict) -> str:
    """Stream a long request and cancel it once its first partial text arrives, or after
    CANCEL_WAIT_S without one (the race keeps 16 requests in flight on one core: a 400-token
    window, with its temperature retries, can take longer than that to give its first text)."""
    try:
        for _reply in grpc_stream(
            url, MODEL, long_request(fields, stream=True), timeout_s=CANCEL_WAIT_S
        ):
            return "first reply"  # closing the stream early cancels the request
    except RequestError as err:
        return str(err)
    except queue.Empty:
        return "cancelled before its first reply"  # the stream closed: cancelled too
    return "no reply"


def test_responses_racing_cancel_polls_do_not_crash_the_server(own_server, url, short):
    kinds = ["stream", "plain", "stream", "cancel", "stream", "timeout", "stream", "refused"]
    counts = {kind: 0 for kind in kinds}
    failures: list[str] = []
    deadline = time.monotonic() + RACE_SECONDS

    def one(kind: str, adapter: str, tokens: int) -> None:
        fields = {**short, "sampling_parameters": sampling(max_tokens=tokens)}
        parameters = {"lora_name": adapter} if adapter else None
        if kind == "cancel":
            outcome = cancelled_after_first_reply(url, fields)
            ok = outcome in ("first reply", "cancelled before its first reply")
            ok = ok or "CANCELLED" in outcome
        elif kind == "timeout":  # a 1 ms limit: ends with an error or in time, never hangs
            fields = {**fields, "sampling_parameters": sampling(max_tokens=64, ignore_eos=True)}
            ok = send_with_timeout(url, fields, timeout_us=1000)
        elif kind == "refused":
            outcome = grpc_one(url, MODEL, {**fields, "language": "xx"}, parameters)
            ok = outcome.error is not None and "language" in outcome.error
        else:
            outcome = grpc_one(url, MODEL, {**fields, "stream": kind == "stream"}, parameters)
            ok = outcome.error is None and outcome.outputs["text_output"][0] is not None
        if not ok:
            failures.append(f"{kind} {adapter or 'base'}: {outcome}")

    def client_loop(offset: int) -> None:
        for n in itertools.count(offset):
            if time.monotonic() > deadline or own_server.process.poll() is not None:
                return
            kind = kinds[n % len(kinds)]
            try:
                one(kind, ("", "alpha", "beta")[n % 3], 1 + n % 3)
            except Exception as err:  # a client error is a failure, never a silent end
                failures.append(f"{kind}: {err!r}")
            counts[kind] += 1

    clients = [in_background(client_loop, offset) for offset in range(RACE_CLIENTS)]
    for thread, _ in clients:
        thread.join(RACE_SECONDS + 120)
    log = own_server.log_path.read_text(errors="replace")
    assert own_server.process.poll() is None, "tritonserver died:\n" + log[-3000:]
    assert "Signal (11)" not in log, log[-3000:]
    assert not any(thread.is_alive() for thread, _ in clients), "a request hangs"
    assert failures == [], failures[:5]
    assert counts["stream"] >= 20 and counts["cancel"] >= 2, counts
    assert grpcclient.InferenceServerClient(url).is_model_ready(MODEL)


def send_with_timeout(url: str, fields: dict, timeout_us: int) -> bool:
    from lora_client.requests import infer_inputs

    client = grpcclient.InferenceServerClient(url)
    replies: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    try:
        client.async_stream_infer(
            MODEL, infer_inputs(grpcclient, {**fields, "stream": True}), timeout=timeout_us
        )
        while True:
            result, error = replies.get(timeout=60)
            if error is not None:
                return "timeout" in str(error).lower() or "exceeded" in str(error).lower()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return True
    finally:
        client.stop_stream()
        client.close()


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
