"""P6 (memory per loaded adapter) and the machine's load while measuring.

P6: the resident memory (RSS, and USS: pages no other process shares) of the engine's own
processes (vLLM's EngineCore and its worker; the worker holds the weights, the KV cache and the
LoRA cache) is read before and after loading a batch of adapters into the in-process engine
(AsyncLLM.add_lora: read from disk into the engine's CPU LoRA cache, `max_cpu_loras` of them;
on a CPU machine the `max_loras` slots the batches run on are allocated at start-up, so they are
not part of the growth). Growth per adapter / the adapter's adapter_model.safetensors size is
the figure; each batch is one repetition, after one warm-up adapter whose first load also
allocates the manager's own structures.

Machine load: CPU seconds used by everything else on the machine (all CPUs' busy time minus our
own processes' CPU time) per second of measurement, so the report can say when the machine was
busy with other work.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class MemorySample:
    rss: int  # bytes, summed over the engine's processes
    uss: int


def sample_memory(pids: list[int]) -> MemorySample:
    import psutil

    rss = uss = 0
    for pid in pids:
        try:
            info = psutil.Process(pid).memory_full_info()
        except psutil.NoSuchProcess:
            continue
        rss += info.rss
        uss += info.uss
    return MemorySample(rss, uss)


def growth_per_adapter(
    before: MemorySample, after: MemorySample, adapters: int, file_bytes: int
) -> dict[str, float]:
    """One batch: bytes added per adapter and that divided by the adapter file's size."""
    if adapters < 1 or file_bytes < 1:
        raise ValueError("need at least one adapter and a non-empty adapter file")
    rss = (after.rss - before.rss) / adapters
    uss = (after.uss - before.uss) / adapters
    return {
        "rss_per_adapter": rss,
        "uss_per_adapter": uss,
        "rss_ratio": rss / file_bytes,
        "uss_ratio": uss / file_bytes,
    }


def measure_adapter_memory(
    load: Callable[[list], None],
    pids: Callable[[], list[int]],
    lora_requests: list,
    *,
    batches: int,
    batch_size: int,
    file_bytes: int,
    settle_s: float = 1.0,
) -> dict:
    """Load one warm-up adapter, then `batches` batches of `batch_size`, sampling around each."""
    needed = 1 + batches * batch_size
    if len(lora_requests) < needed:
        raise ValueError(f"P6 needs {needed} adapters, got {len(lora_requests)}")
    load(lora_requests[:1])
    time.sleep(settle_s)
    rounds = []
    for index in range(batches):
        batch = lora_requests[1 + index * batch_size : 1 + (index + 1) * batch_size]
        before = sample_memory(pids())
        load(batch)
        time.sleep(settle_s)
        after = sample_memory(pids())
        rounds.append(
            {"before_rss": before.rss, "after_rss": after.rss}
            | growth_per_adapter(before, after, len(batch), file_bytes)
        )
    return {"file_bytes": file_bytes, "batch_size": batch_size, "rounds": rounds}


class LoadMeter:
    """CPU used by other processes (cores busy) between start() and stop()."""

    def __init__(self, own_pids: Callable[[], list[int]]):
        self._own_pids = own_pids

    def _snapshot(self):
        import psutil

        times = psutil.cpu_times()
        busy = times.user + times.nice + times.system + times.irq + times.softirq
        busy += getattr(times, "steal", 0.0)
        own = 0.0
        for pid in self._own_pids():
            try:
                cpu = psutil.Process(pid).cpu_times()
            except psutil.NoSuchProcess:
                continue
            own += cpu.user + cpu.system + cpu.children_user + cpu.children_system
        return time.monotonic(), busy, own

    def start(self) -> None:
        self._start = self._snapshot()

    def stop(self) -> float:
        """Average number of cores other processes kept busy."""
        end = self._snapshot()
        wall = end[0] - self._start[0]
        if wall <= 0:
            return 0.0
        other = (end[1] - self._start[1]) - (end[2] - self._start[2])
        return max(0.0, other / wall)
