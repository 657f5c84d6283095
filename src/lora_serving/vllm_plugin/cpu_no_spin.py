"""On CPU, vLLM's processes wait for each other's messages asleep, not spinning.

Not a defect on a GPU host, a cost on a CPU one: vLLM's shared-memory message queue
(`shm_broadcast.SpinCondition`) keeps a reader busy-looping on `sched_yield()` for a second after
each message it read, so a loaded engine's EngineCore spins a whole core while its worker runs
the forward pass (and the worker while the EngineCore schedules). On a GPU host that core is
spare and the spin saves microseconds per step. On CPU it is a core taken from the model itself,
from the other engine, from Triton and our stubs: on a two-core host, with qwen_vl_lora decoding,
its EngineCore ran at 100 % of a core and Triton's /v2/health/ready and /metrics took 2-12 s to
answer.

Readers here sleep on the queue's notification socket as soon as nothing is there. The writer
notifies on every message, but its socket keeps at most one notification in flight (zmq PUB,
high-water mark 1): one sent while the reader has not yet taken the previous one is dropped,
and vLLM's idle reader would then sleep its full 5 s recheck interval (chats ran 20x slower).
So a reader that read within the last second rechecks the buffer at least every
RECHECK_MS: a dropped notification costs at most that, and a notification wakes it at once.
An engine idle for a second sleeps as vLLM's does. `LORA_SERVING_MQ_SPIN_S` sets the spin
time (seconds; vLLM's own is 1.0) for operators who want it back.
"""

import importlib
import os
import time
from typing import Any

SPIN_ENV = "LORA_SERVING_MQ_SPIN_S"
DEFAULT_SPIN_S = 0.0
RECHECK_MS = 1
RECENT_READ_S = 1.0
QUEUE_MODULE = "vllm.distributed.device_communicators.shm_broadcast"

_ORIGINAL: dict[str, Any] = {}


def spin_seconds() -> float:
    value = os.environ.get(SPIN_ENV, "").strip()
    return max(0.0, float(value)) if value else DEFAULT_SPIN_S


def capped_timeout_ms(timeout_ms: int | None, seconds_since_read: float) -> int | None:
    """How long one wait may sleep: at most RECHECK_MS while messages are flowing."""
    if seconds_since_read > RECENT_READ_S:
        return timeout_ms
    return RECHECK_MS if timeout_ms is None else min(timeout_ms, RECHECK_MS)


def _wait(self, timeout_ms: int | None = None) -> None:
    """vLLM's wait, with our spin time (readers created before the plugin loaded included) and
    the sleep capped while messages are flowing."""
    spin = _ORIGINAL["spin_s"]
    if self.busy_loop_s != spin:
        self.busy_loop_s = spin
    since_read = time.monotonic() - self.last_read
    return _ORIGINAL["wait"](self, capped_timeout_ms(timeout_ms, since_read))


def apply() -> bool:
    """Give SpinCondition readers our spin time; True if this call changed the class."""
    condition = importlib.import_module(QUEUE_MODULE).SpinCondition
    current = condition.__dict__.get("wait")
    if current is None or not hasattr(condition, "record_read"):
        raise RuntimeError(f"{QUEUE_MODULE}.SpinCondition has changed: re-check cpu_no_spin")
    if current is _wait:
        return False
    _ORIGINAL["wait"] = current
    _ORIGINAL["spin_s"] = spin_seconds()
    condition.wait = _wait
    return True
