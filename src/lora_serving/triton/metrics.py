"""Our metrics on Triton's Prometheus endpoint (pb_utils.MetricFamily), labelled by model and
adapter ("(base)": no adapter; "(unknown)": refused before its adapter was known).

  lora_requests_total{outcome}           jobs (batch rows) by outcome: success, error,
                                         cancelled, refused
  lora_prompt_tokens_total               prompt tokens of every engine request of a job
  lora_generation_tokens_total           generated tokens, likewise
  lora_time_to_first_token_seconds       histogram: job start -> first generated token
  lora_request_latency_seconds           histogram: job start -> job end
  lora_requests_running / _waiting       gauges: engine requests per adapter (vLLM's scheduler)
  lora_kv_cache_usage_perc               gauge: fraction of the engine's KV cache in use (0..1)
  lora_max_loras                         gauge: the engine's LoRA slots (max_loras; 0: LoRA off)
  lora_adapters{state}                   gauge: served adapters loaded / cached / registered
  lora_adapter_root_error_since_seconds{root}   gauge: Unix time the adapter root's current
                                         error began (cannot be read); 0 while it reads fine
  lora_adapter_slot_loads_total          adapters moved into a LoRA slot (vLLM activate_adapter)
  lora_adapter_cache_loads_total         adapters read from their folder into the engine's cache
  lora_encoder_runs_total                Whisper: audio windows the encoder computed
  lora_encoder_reuses_total              Whisper: engine requests that reused a window's encoder
                                         output (probe, retries, beam steps)
  lora_cross_kv_runs_total               Whisper: cross-attention K/V computed, counted per
                                         engine request window and decoder layer
  lora_cross_kv_reuses_total             Whisper: likewise, reused from the window's first request

`record` only queues an event: every metric update is a round trip to the Triton process, so one
thread applies them and the engine loop never waits (as vllm_backend's metrics thread).
"""

import os
import queue
import threading

import triton_python_backend_utils as pb_utils

from lora_serving.metrics import (
    REFUSED,
    AdapterLoads,
    AdapterRootErrors,
    AdapterStates,
    EncoderWork,
    JobFinished,
    RequestRefused,
    SchedulerLoad,
)

# vLLM's own buckets for these histograms, so dashboards read the same.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip

_FAMILIES = {
    "requests": ("lora_requests_total", "COUNTER", "Generation jobs (batch rows) by outcome"),
    "prompt_tokens": ("lora_prompt_tokens_total", "COUNTER", "Prompt tokens processed"),
    "generation_tokens": ("lora_generation_tokens_total", "COUNTER", "Tokens generated"),
    "ttft": ("lora_time_to_first_token_seconds", "HISTOGRAM", "Time to the first token"),
    "latency": ("lora_request_latency_seconds", "HISTOGRAM", "Job latency, start to end"),
    "running": ("lora_requests_running", "GAUGE", "Engine requests running"),
    "waiting": ("lora_requests_waiting", "GAUGE", "Engine requests waiting to be scheduled"),
    "kv_cache_usage": ("lora_kv_cache_usage_perc", "GAUGE", "KV cache usage, 1 = full"),
    "max_loras": ("lora_max_loras", "GAUGE", "Adapters one batch can use (LoRA slots)"),
    "adapters": ("lora_adapters", "GAUGE", "Served adapters by state"),
    "root_errors": (
        "lora_adapter_root_error_since_seconds",
        "GAUGE",
        "Unix time an adapter root's current read error began; 0 while it reads fine",
    ),
    "slot_loads": ("lora_adapter_slot_loads_total", "COUNTER", "Adapters loaded into a slot"),
    "cache_loads": ("lora_adapter_cache_loads_total", "COUNTER", "Adapters read into the cache"),
    "encoder_runs": ("lora_encoder_runs_total", "COUNTER", "Audio windows encoded"),
    "encoder_reuses": ("lora_encoder_reuses_total", "COUNTER", "Encoder outputs reused"),
    "cross_kv_runs": (
        "lora_cross_kv_runs_total",
        "COUNTER",
        "Cross-attention K/V computed (per request window and decoder layer)",
    ),
    "cross_kv_reuses": (
        "lora_cross_kv_reuses_total",
        "COUNTER",
        "Cross-attention K/V reused (per request window and decoder layer)",
    ),
}
_BUCKETS = {"ttft": TTFT_BUCKETS, "latency": LATENCY_BUCKETS}
_STOP = object()


class TritonMetrics:
    def __init__(self, model: str, log_error):
        self._model = model
        # Triton hands the same Prometheus series to every family object that asks for the same
        # name and labels, but each family frees the series when its own last user goes. While
        # a model reloads, its old and new stubs run side by side: without a label of their own,
        # the old stub's unload would free the series the new one writes to (heap corruption in
        # tritonserver). Sum over stub_pid for a model's totals.
        self._stub_pid = str(os.getpid())
        self._log_error = log_error
        self._families = {
            key: pb_utils.MetricFamily(
                name=name, description=text, kind=getattr(pb_utils.MetricFamily, kind)
            )
            for key, (name, kind, text) in _FAMILIES.items()
        }
        self._series: dict[tuple, object] = {}
        self._gauges: dict[str, dict[str, int]] = {"running": {}, "waiting": {}}  # last values
        self._engine_gauges: dict[str, float] = {}  # kv_cache_usage, max_loras: last values
        self._totals: dict[str, int] = {}  # last totals read from the engine
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="metrics", daemon=True)
        self._thread.start()

    def record(self, event) -> None:
        self._queue.put(event)

    def close(self) -> None:
        """Apply what is queued, then delete the series before their families (pb_utils)."""
        self._queue.put(_STOP)
        self._thread.join(timeout=10)
        # Triton 2.51 keeps an unloaded stub's series on /metrics: its gauges must not go on
        # counting requests and adapters it no longer has.
        for (family, *_labels), metric in self._series.items():
            if _FAMILIES[family][1] == "GAUGE":
                try:
                    metric.set(0)
                except Exception as err:  # closing anyway
                    self._log_error(f"{self._model}: resetting {family} failed: {err!r}")
        self._series.clear()
        self._families.clear()

    # ---- metrics thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while (event := self._queue.get()) is not _STOP:
            try:
                self._apply(event)
            except Exception as err:  # a metric must never take serving down
                self._log_error(f"{self._model}: metrics update failed: {err!r}")

    def _metric(self, family: str, **labels):
        key = (family, *sorted(labels.items()))
        metric = self._series.get(key)
        if metric is None:
            extra = {"buckets": _BUCKETS[family]} if family in _BUCKETS else {}
            labels = {"model": self._model, "stub_pid": self._stub_pid, **labels}
            metric = self._families[family].Metric(labels=labels, **extra)
            self._series[key] = metric
        return metric

    def _apply(self, event) -> None:
        if isinstance(event, JobFinished):
            adapter = event.adapter
            self._metric("requests", adapter=adapter, outcome=event.outcome).increment(1)
            if event.prompt_tokens:
                self._metric("prompt_tokens", adapter=adapter).increment(event.prompt_tokens)
            if event.generation_tokens:
                tokens = event.generation_tokens
                self._metric("generation_tokens", adapter=adapter).increment(tokens)
            if event.time_to_first_token_s is not None:
                self._metric("ttft", adapter=adapter).observe(event.time_to_first_token_s)
            self._metric("latency", adapter=adapter).observe(event.latency_s)
        elif isinstance(event, RequestRefused):
            self._metric("requests", adapter=event.adapter, outcome=REFUSED).increment(1)
        elif isinstance(event, SchedulerLoad):
            self._set_gauges("running", event.running)
            self._set_gauges("waiting", event.waiting)
            self._set_engine_gauge("kv_cache_usage", event.kv_cache_usage)
            self._set_engine_gauge("max_loras", event.max_loras)
        elif isinstance(event, AdapterStates):
            for state, count in event.counts.items():
                self._metric("adapters", state=state).set(count)
        elif isinstance(event, AdapterRootErrors):
            for root, since in event.since.items():
                self._metric("root_errors", root=root).set(since)
        elif isinstance(event, AdapterLoads):
            self._count_up("slot_loads", event.slot_loads)
            self._count_up("cache_loads", event.cache_loads)
        elif isinstance(event, EncoderWork):
            self._count_up("encoder_runs", event.runs)
            self._count_up("encoder_reuses", event.reuses)
            self._count_up("cross_kv_runs", event.cross_kv_runs)
            self._count_up("cross_kv_reuses", event.cross_kv_reuses)

    def _count_up(self, family: str, total: int) -> None:
        """A counter follows a total read from the engine (it only grows)."""
        last = self._totals.get(family, 0)
        if total > last:
            self._metric(family).increment(total - last)
            self._totals[family] = total

    def _set_engine_gauge(self, family: str, value: float) -> None:
        if self._engine_gauges.get(family) != value:
            self._metric(family).set(value)
            self._engine_gauges[family] = value

    def _set_gauges(self, family: str, counts) -> None:
        """Update the adapters whose count changed (back to 0 for those no longer counted)."""
        last = self._gauges[family]
        for adapter in set(last) | set(counts):
            value = counts.get(adapter, 0)
            if last.get(adapter) != value:
                self._metric(family, adapter=adapter).set(value)
                last[adapter] = value
