"""Start the tritonserver laid out by `make setup` with the environment its Python backend needs.

Used by `make serve` and by the test suite, so both run the server the same way (`make serve`
also starts the OpenAI-compatible front, `lora-openai`, beside it: `OpenAIFront`):
- LD_LIBRARY_PATH: the venv's own libpython first (the backend stub embeds it), then the
  libraries shipped with the server;
- PATH: the venv first (the stub and vLLM's EngineCore start the first `python3` they find);
- its own process group, so stopping it also stops every stub and EngineCore it started.
"""

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from lora_serving import dtype_choice, weights_choice

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTROL_TOKEN_VARIABLE = "LORA_CONTROL_TOKEN"  # model_repository's control_token_env
TRITON_DIR = REPO_ROOT / ".triton"


def py_spy() -> str | None:
    local = REPO_ROOT / ".venv" / "bin" / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def server_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """tritonserver's environment: `base` (this process's environment when None) plus what
    the stubs need."""
    env = dict(os.environ if base is None else base)
    venv_bin = str(Path(sys.executable).parent)
    libs = [sysconfig.get_config_var("LIBDIR"), str(TRITON_DIR / "lib")]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(libs)
    env["PATH"] = f"{venv_bin}:{env.get('PATH', '')}"
    env.setdefault("LC_ALL", "C.UTF-8")
    env.setdefault("VLLM_PLUGINS", "lora_serving")  # our fixes on, hub-reaching plugins off
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    return env


CONTROL_TOKEN_HEADER_PATTERN = "^control_token$"


def server_command(
    model_repository: Path, http: int, grpc: int, metrics: int, extra: list[str] = ()
) -> list[str]:
    binary = TRITON_DIR / "bin" / "tritonserver"
    if not binary.exists():
        raise SystemExit(f"{binary} is missing: run `make setup` first")
    return [
        str(binary),
        f"--model-repository={model_repository}",
        f"--backend-directory={TRITON_DIR / 'backends'}",
        f"--cache-directory={TRITON_DIR / 'caches'}",
        "--http-address=127.0.0.1",
        f"--http-port={http}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={metrics}",
        "--allow-metrics=true",
        # A `control_token` gRPC header reaches the model as that request parameter
        # (adapters.control), so clients can keep the token out of the request body.
        f"--grpc-header-forward-pattern={CONTROL_TOKEN_HEADER_PATTERN}",
        *extra,
    ]


class TritonServer:
    """A running tritonserver (and everything it started); `stop()` leaves nothing behind."""

    def __init__(
        self,
        model_repository: Path,
        *,
        http=8000,
        grpc=8001,
        metrics=8002,
        extra_args: list[str] = (),
        log_path: Path | None = None,
        dtype: str | None = None,
        weights: str | None = None,
        environment: Mapping[str, str] | None = None,
    ):
        """`dtype`: every model's float type for this run (lora_serving.dtype_choice); None:
        model.json's, unless the caller's environment sets LORA_SERVING_DTYPE. `weights`: float
        or int8 (lora_serving.weights_choice); None: LORA_SERVING_WEIGHTS or float.
        `environment`: what tritonserver starts from instead of this process's environment
        (taken by a caller that starts the server from a thread while os.environ may change)."""
        self.http, self.grpc, self.metrics = http, grpc, metrics
        # The models' adapter control token (serving.adapters.control_token_env): one per
        # process unless given. tritonserver inherits it, and so do this process's own clients
        # (lora_client's adapter_command, benches) and the front it starts (its admin API).
        if environment is None:
            os.environ.setdefault(CONTROL_TOKEN_VARIABLE, secrets.token_urlsafe(24))
        elif CONTROL_TOKEN_VARIABLE not in environment:
            raise ValueError(f"environment has no {CONTROL_TOKEN_VARIABLE}")
        environment = server_environment(environment)
        if dtype is not None:
            environment[dtype_choice.VARIABLE] = dtype
        if weights is not None:
            environment[weights_choice.VARIABLE] = weights
        self.log_path = log_path
        self._log = open(log_path, "wb") if log_path else None  # noqa: SIM115 - lives with server
        self.process = subprocess.Popen(
            server_command(model_repository, http, grpc, metrics, list(extra_args)),
            env=environment,
            stdout=self._log,
            stderr=subprocess.STDOUT if self._log else None,
            start_new_session=True,
        )

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=2
            ) as response:
                return response.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until ready; raises if the server exits or the time runs out."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"tritonserver exited with {self.process.returncode}" + self._log_hint()
                )
            if self.is_ready():
                return time.monotonic() - start
            time.sleep(1)
        raise TimeoutError(f"tritonserver not ready after {timeout_s:.0f} s" + self._log_hint())

    def python_stacks(self) -> str:
        """Every Python thread of every process this server started (stubs, EngineCores,
        workers), from py-spy: what a start or request that hangs is waiting on."""
        import psutil

        binary = py_spy()
        if binary is None:
            return "py-spy is not installed (requirements/cpu.txt pins it)"
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return "tritonserver has exited"
        parts = []
        for child in children:
            try:
                title = f"=== pid {child.pid}: {' '.join(child.cmdline())[:160]}"
            except psutil.Error:
                continue
            dump = subprocess.run(
                [binary, "dump", "--pid", str(child.pid)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            parts.append(f"{title}\n{dump.stdout}{dump.stderr}")
        return "\n".join(parts) or "no child processes"

    def _log_hint(self) -> str:
        return f"; see {self.log_path}" if self.log_path else ""

    def stop(self, grace_s: float = 60.0) -> None:
        """SIGTERM (Triton unloads models, engines shut down), then kill what is left."""
        _stop_group(self.process, grace_s)  # and orphaned stubs / EngineCores, if any
        if self._log:
            self._log.close()


class OpenAIFront:
    """A running `lora-openai` (src/lora_openai) talking to a tritonserver's gRPC port, in its
    own process group; `stop()` ends it. It holds no model, so it starts in about a second."""

    def __init__(
        self,
        triton_grpc: int,
        port: int,
        *,
        triton_metrics: int = 8002,
        host="127.0.0.1",
        log_path: Path | None = None,
        api_keys_file: Path | None = None,
        api_key: str | None = None,
        options: Sequence[str] = (),
    ):
        self.port, self.host = port, host
        self.log_path = log_path
        self._log = open(log_path, "wb") if log_path else None  # noqa: SIM115 - lives with it
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lora_openai",
                "--triton-url",
                f"127.0.0.1:{triton_grpc}",
                "--triton-metrics-url",
                f"http://127.0.0.1:{triton_metrics}/metrics",
                "--host",
                host,
                "--port",
                str(port),
                *(["--api-keys-file", str(api_keys_file)] if api_keys_file else []),
                *options,  # more lora-openai flags, e.g. --realtime-idle-timeout-s 1
            ],
            # A single key travels in the environment, never on a command line (ps shows those).
            env={**os.environ, **({"LORA_OPENAI_API_KEY": api_key} if api_key else {})},
            stdout=self._log,
            stderr=subprocess.STDOUT if self._log else None,
            start_new_session=True,
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def wait_listening(self, timeout_s: float = 60) -> None:
        """Until it answers HTTP (any status: Triton may still be loading)."""
        import urllib.error

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"lora-openai exited with {self.process.returncode}")
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=2).close()
                return
            except urllib.error.HTTPError:
                return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"lora-openai not listening on {self.url} after {timeout_s:.0f} s")

    def stop(self, grace_s: float = 10.0) -> None:
        _stop_group(self.process, grace_s)
        if self._log:
            self._log.close()


def _stop_group(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM a process started in its own group, wait up to `grace_s`, then kill the group."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _interrupt(*_):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-repository", type=Path, default=REPO_ROOT / "model_repository")
    parser.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    parser.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", 8001)))
    parser.add_argument(
        "--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002))
    )
    parser.add_argument(
        "--openai-port",
        type=int,
        default=int(os.environ.get("OPENAI_PORT", 9000)),
        help="port of the OpenAI-compatible front (lora-openai); 0: do not start it",
    )
    parser.add_argument(
        "--dtype",
        choices=dtype_choice.CHOICES,
        default=os.environ.get("DTYPE") or None,
        help="every model's float type for this run (auto: bfloat16 on a CPU with AMX / "
        "AVX-512 BF16, else float32; model.json's on a GPU); default: each model.json's",
    )
    parser.add_argument(
        "--weights",
        choices=weights_choice.CHOICES,
        default=os.environ.get("WEIGHTS") or None,
        help="int8: models with a serving.int8_model (whisper_lora) load it, int8 linear "
        "layers; default: float",
    )
    parser.add_argument(
        "--api-keys-file",
        type=Path,
        default=os.environ.get("API_KEYS_FILE") or None,
        help="the OpenAI front's API keys (lora-openai --api-keys-file); a single key: "
        "$LORA_OPENAI_API_KEY; neither: no keys",
    )
    parser.add_argument("extra", nargs="*", help="more tritonserver arguments (after --)")
    args = parser.parse_args(argv)
    extra = list(args.extra)
    if not any(arg.startswith("--model-control-mode") for arg in extra):
        # Every model loads at start, and the repository API can reload one whose engine died
        # (the model unloads itself then; docs/reliability.md). Ports bind to 127.0.0.1 only.
        extra += ["--model-control-mode=explicit", "--load-model=*"]
    server = TritonServer(
        args.model_repository.resolve(),
        http=args.http_port,
        grpc=args.grpc_port,
        metrics=args.metrics_port,
        extra_args=extra,
        dtype=args.dtype,
        weights=args.weights,
    )
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it as cleanly as Ctrl-C
    front = None
    try:
        seconds = server.wait_ready(timeout_s=900)
        openai = ""
        if args.openai_port:
            front = OpenAIFront(
                args.grpc_port,
                args.openai_port,
                triton_metrics=args.metrics_port,
                api_keys_file=args.api_keys_file,
            )
            front.wait_listening()
            openai = f", OpenAI API {front.url}/v1"
        print(
            f"\ntritonserver ready in {seconds:.0f} s: HTTP 127.0.0.1:{args.http_port}, "
            f"gRPC 127.0.0.1:{args.grpc_port}, metrics 127.0.0.1:{args.metrics_port}/metrics"
            f"{openai}. Ctrl-C stops it.",
            flush=True,
        )
        server.process.wait()
    except KeyboardInterrupt:
        print("\nstopping tritonserver ...", flush=True)
    except TimeoutError as err:
        print(f"\n{err}; what its processes are doing:\n{server.python_stacks()}", flush=True)
        return 1
    finally:
        if front is not None:
            front.stop()
        server.stop()
    return server.process.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
