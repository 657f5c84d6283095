"""Shared fixtures: the demo models, espeak-ng speech, and ONE real tritonserver per test run."""

import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "demo_models"


def pytest_configure(config):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def demo_models() -> Path:
    """Built by `make setup`; a missing model is a failure, never a skip."""
    from lora_tools.demo.qwen3_vl import ADAPTER_PATTERNS as QWEN3_VL_ADAPTERS

    needed = [
        "whisper-base",
        "whisper-adapters/alpha",
        "whisper-adapters/beta",
        "whisper-tiny.en",
        "whisper-tiny.en-adapters/all_layers",
        "whisper-v3-shape",
        "whisper-v3-shape-adapters/all_layers",
        "qwen2-vl-tiny",
        "qwen2-vl-adapters/alpha",
        "qwen2-vl-adapters/beta",
        "qwen2_5-vl-tiny",
        "qwen2_5-vl-adapters/alpha",
        "qwen2_5-vl-adapters/beta",
        "qwen3-vl-tiny",
        *(f"qwen3-vl-adapters/{name}" for name in QWEN3_VL_ADAPTERS),
    ]
    missing = [name for name in needed if not (DEMO / name).is_dir()]
    assert not missing, f"demo models missing {missing}: run `make setup`"
    return DEMO


@pytest.fixture(scope="session")
def speech(tmp_path_factory):
    """Synthesise English sentences with espeak-ng (a missing espeak-ng fails the test)."""
    assert shutil.which("espeak-ng"), "espeak-ng is not installed: run `make setup`"
    folder = tmp_path_factory.mktemp("speech")

    def make(text: str, voice: str = "en-us", speed: int = 150) -> Path:
        path = folder / f"{abs(hash((text, voice, speed)))}.wav"
        if not path.exists():
            subprocess.run(
                ["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(path), text],
                check=True,
                capture_output=True,
            )
        return path

    return make


def load_16k(path: Path) -> np.ndarray:
    """The same decode + resample the server does, so references see identical samples."""
    from lora_serving.audio import decode_audio_file, to_whisper_input

    samples, rate = decode_audio_file(path.read_bytes(), max_seconds=30)
    return to_whisper_input(samples, rate, max_seconds=30)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


STARTUP_TIMEOUT_S = 360  # ~40-120 s normally for both engines on 2 cores


def _test_models() -> list[str]:
    """All models ("*"); LORA_SERVING_TEST_MODELS=whisper_lora (comma list) narrows a local
    run. CI and `make test` load every model."""
    names = os.environ.get("LORA_SERVING_TEST_MODELS", "*").split(",")
    return [name.strip() for name in names if name.strip()] or ["*"]


def only_with_model(model: str):
    """Marks a module that needs `model` served: skipped only in a narrowed local run."""
    models = _test_models()
    return pytest.mark.skipif(
        "*" not in models and model not in models,
        reason=f"{model} is not loaded in this run (LORA_SERVING_TEST_MODELS)",
    )


def start_triton(
    tmp_path_factory,
    label: str,
    load_models: list[str],
    repository: Path = REPO / "model_repository",
    environment: dict[str, str] | None = None,
):
    """A ready tritonserver serving `repository` (model_repository/) with explicit model control.

    Seen twice (once in CI, never in 32 starts in a row here): a model's stub logs the end of
    its `initialize` and Triton 2.51 never reports the model loaded. The Python stacks of
    every process then go next to the log (stacks.txt), and the start is tried once more.
    """
    from lora_serving.launcher import TritonServer

    for attempt in (1, 2):
        log_path = tmp_path_factory.mktemp(label) / "tritonserver.log"
        server = TritonServer(
            repository,
            http=_free_port(),
            grpc=_free_port(),
            metrics=_free_port(),
            log_path=log_path,
            extra_args=["--model-control-mode=explicit", *load_models],
            dtype="float32",  # served outputs are compared with the float32 reference
            environment=environment,
        )
        try:
            seconds = server.wait_ready(timeout_s=STARTUP_TIMEOUT_S)
        except TimeoutError:
            stacks = log_path.with_name("stacks.txt")
            stacks.write_text(server.python_stacks())
            server.stop()
            print(
                f"\nWARNING: tritonserver start {attempt} stalled (log: {log_path}, "
                f"Python stacks: {stacks}):\n{stacks.read_text()}",
                file=sys.stderr,
            )
            if attempt == 2:
                raise
        else:
            print(f"\ntritonserver ready in {seconds:.0f} s (log: {log_path})")
            return server
    raise AssertionError("unreachable: the second stalled start raised")


# The shared server's object store: a moto S3-API server for the whole run, named to
# qwen_vl_lora as an extra adapter root through model.json's serving.adapters.roots_env (so the
# repository's model.json loads unchanged), found by the model's boto3 client through the
# standard AWS variables tritonserver inherits.
E2E_BUCKET = "lora-e2e"
QWEN_VL_S3_ROOT = f"s3://{E2E_BUCKET}/qwen_vl_lora/"
QWEN_VL_ROOTS_ENV = "LORA_QWEN_VL_ADAPTER_ROOTS"  # model_repository/qwen_vl_lora's roots_env
_object_store = None


def server_environment(tmp_path_factory) -> dict[str, str]:
    """The shared server's environment, set in this process too (its clients read the control
    token and the store's address from it). Taken on the main thread before anything runs: a
    unit test running beside the early start monkeypatches os.environ (its own S3 server's
    address, for one), which neither the start nor the server may see, nor it theirs."""
    global _object_store
    from lora_serving.launcher import CONTROL_TOKEN_VARIABLE
    from tests.s3_server import S3Server

    if _object_store is None:
        _object_store = S3Server(tmp_path_factory.mktemp("s3") / "moto.log")
        os.environ.update(_object_store.environment())
        os.environ[QWEN_VL_ROOTS_ENV] = QWEN_VL_S3_ROOT
        os.environ.setdefault(CONTROL_TOKEN_VARIABLE, secrets.token_urlsafe(24))
    return dict(os.environ)


def start_object_store() -> None:
    """The run's S3-API server, started once, with its bucket."""
    if _object_store.process is None:
        _object_store.start().client().create_bucket(Bucket=E2E_BUCKET)


@pytest.fixture(scope="session")
def object_store(triton_server):
    """(the S3-API server, its bucket) that the shared server's qwen_vl_lora reads adapters
    from (QWEN_VL_S3_ROOT)."""
    return _object_store, E2E_BUCKET


class _EarlyStart:
    """The shared server, started in a thread as soon as collection shows an e2e test: its
    ~1.5 min start (two engines) then overlaps the unit tests, which leave the second core idle."""

    def __init__(self, tmp_path_factory):
        self.server = None
        self.error: BaseException | None = None
        environment = server_environment(tmp_path_factory)
        self._thread = threading.Thread(
            target=self._start,
            args=(tmp_path_factory, environment),
            name="triton-early-start",
            daemon=True,
        )
        self._thread.start()

    def _start(self, tmp_path_factory, environment) -> None:
        try:
            start_object_store()
            self.server = start_triton(
                tmp_path_factory,
                "triton",
                [f"--load-model={name}" for name in _test_models()],
                environment=environment,
            )
        except BaseException as err:  # re-raised by the fixture, in the test that needs it
            self.error = err

    def result(self):
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.server


_early_start: _EarlyStart | None = None

# Modules that reload a shared model with another configuration (each reload starts an engine,
# ~1 min on 2 cores) run last, in this order, and leave their configuration loaded: restoring
# the repository's own would start one more engine for nobody.
RELOADING_MODULES = ("test_qwen2_5_variant.py", "test_qwen3_vl_variant.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        name = Path(item.path).name
        return RELOADING_MODULES.index(name) + 1 if name in RELOADING_MODULES else 0

    items.sort(key=rank)  # stable: every other test keeps its place


def pytest_collection_finish(session):
    global _early_start
    e2e = REPO / "tests" / "e2e"
    if any(e2e in Path(item.path).parents for item in session.items):
        _early_start = _EarlyStart(session.config._tmp_path_factory)


def pytest_unconfigure(config):
    """A run that ended before any e2e test asked for the server (stopped early, or every e2e
    test deselected) still stops it, once its start is over."""
    if _early_start is not None:
        try:
            _early_start.result().stop()
        except BaseException:
            pass  # the start failed: nothing is left running
    if _object_store is not None:
        _object_store.stop()


@pytest.fixture(scope="session")
def triton_server(demo_models, tmp_path_factory):
    """The one tritonserver of this test run, serving model_repository/ as users start it:
    every model loaded at start, plus the repository API, which tests use to reload a model
    with another model.json."""
    global _early_start
    if _early_start is not None:
        server, _early_start = _early_start.result(), None
    else:
        environment = server_environment(tmp_path_factory)
        start_object_store()
        server = start_triton(
            tmp_path_factory,
            "triton",
            [f"--load-model={name}" for name in _test_models()],
            environment=environment,
        )
    try:
        yield server
    finally:
        server.stop()
        print(f"tritonserver log: {server.log_path}")
