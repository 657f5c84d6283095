"""The bench's view of processes and ports: which pids are vLLM engines (their stubs, EngineCore and
worker) and pausing the Triton models not being measured. Shared by run.py, inprocess.py and
wer.py (kept out of run.py so none of them imports run.py), and the tritonserver + lora-openai pair
the front's benches (noisy_neighbour, realtime_latency) start."""

import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def whisper_front(work: Path, **front_options) -> Iterator:
    """tritonserver with whisper_lora alone and lora-openai in front of it (`front_options`:
    OpenAIFront's keyword arguments); yields the front, stops both after. Logs go to `work`."""
    from lora_serving.launcher import REPO_ROOT, OpenAIFront, TritonServer

    grpc, metrics = free_port(), free_port()
    server = TritonServer(
        REPO_ROOT / "model_repository",
        http=free_port(),
        grpc=grpc,
        metrics=metrics,
        extra_args=["--model-control-mode=explicit", "--load-model=whisper_lora"],
        log_path=work / "tritonserver.log",
    )
    front = None
    try:
        print(f"tritonserver ready in {server.wait_ready(timeout_s=600):.0f} s")
        front = OpenAIFront(
            grpc,
            free_port(),
            triton_metrics=metrics,
            log_path=work / "lora-openai.log",
            **front_options,
        )
        front.wait_listening()
        yield front
    finally:
        if front is not None:
            front.stop()
        server.stop()
        print(f"logs: {work}")


def own_pids() -> list[int]:
    import psutil

    me = psutil.Process()
    return [me.pid, *(child.pid for child in me.children(recursive=True))]


def vllm_role(process) -> str | None:
    """ "engine_core" / "worker" for vLLM's processes (they retitle themselves VLLM::...)."""
    try:
        title = " ".join(process.cmdline()[:1]) or process.name()
    except Exception:
        return None
    if not title.startswith("VLLM"):
        return None
    return "engine_core" if "EngineCore" in title else "worker"


def engine_processes(root_pid: int, instance: str | None = None) -> dict[str, int]:
    """{"stub" or "frontend", "engine_core", "worker": pid} of one engine.

    With `instance` (a Triton model instance, e.g. "whisper_lora_0"): the stub below the
    tritonserver `root_pid` and its engine. Without: the engine this process (`root_pid`)
    started itself, leaving out everything below its tritonserver child."""
    import psutil

    root = psutil.Process(root_pid)
    found: dict[str, int] = {}
    if instance is not None:
        for child in root.children():
            if any(instance in part for part in _cmdline(child)):
                found["stub"] = child.pid
                tops = [child]
                break
        else:
            return found
    else:
        found["frontend"] = root.pid
        tops = [c for c in root.children() if "tritonserver" not in c.name()]
    for top in tops:
        for process in [top, *top.children(recursive=True)]:
            role = vllm_role(process)
            if role:
                found.setdefault(role, process.pid)
    return found


def _cmdline(process) -> list[str]:
    """A process's command line; [] for one that has exited or is a zombie (an unloaded
    model's stub, not yet reaped by tritonserver)."""
    import psutil

    try:
        return process.cmdline()
    except psutil.Error:
        return []


class Isolation:
    """Only the side being measured runs.

    A served LoRA model polls its engine's adapter state every few seconds (adapters.fleet's
    STATE_INTERVAL_S); each poll wakes the vLLM worker, which on a GPU host then busy-polls its
    queue for a second (vLLM's SpinCondition; on CPU our plugin's cpu_no_spin keeps it asleep
    unless LORA_SERVING_MQ_SPIN_S is set), and it runs on the core the other configuration's
    engine is pinned to. So before each measurement the stubs of the
    Triton models not being measured are paused (SIGSTOP; resumed with SIGCONT afterwards), and
    the bench waits `settle_s` for the previous side's engine to stop spinning."""

    def __init__(self, settle_s: float):
        self.settle_s = settle_s
        self.stubs: dict[str, int] = {}  # Triton model -> its stub's pid
        self.paused: set[int] = set()

    def register(self, server_pid: int, names: list[str]) -> None:
        for name in names:
            stub = engine_processes(server_pid, f"{name}_0").get("stub")
            if stub is not None:
                self.stubs[name] = stub

    def only(self, running: str | None, settle: bool = True) -> None:
        """Let only Triton model `running` (None: none of them) run; then settle."""
        wanted = {pid for name, pid in self.stubs.items() if name != running}
        for pid in self.paused - wanted:
            self._signal(pid, signal.SIGCONT)
        for pid in wanted - self.paused:
            self._signal(pid, signal.SIGSTOP)
        self.paused = wanted
        if settle:
            time.sleep(self.settle_s)

    def forget(self, name: str) -> None:
        pid = self.stubs.pop(name, None)
        if pid in self.paused:
            self._signal(pid, signal.SIGCONT)
            self.paused.discard(pid)

    def resume_all(self) -> None:
        for pid in self.paused:
            self._signal(pid, signal.SIGCONT)
        self.paused = set()
        self.stubs = {}

    @staticmethod
    def _signal(pid: int, sig) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
