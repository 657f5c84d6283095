"""P1's baseline: the same vLLM engine driven in-process through AsyncLLM, no Triton, no glue.

The engine is built as our Triton model builds it (model.json -> EngineSettings -> the task's
engine overrides -> AsyncEngineArgs, model.json's environment block set first; our vLLM plugin
loads through its entry point). Requests are the perf_analyzer input-data entries themselves,
turned into engine prompts ONCE, before timing, by our own task code (so both sides send exactly
the same prompts, sampling parameters and LoRA requests); the timed loop is then nothing but
AsyncLLM.generate with `concurrency` closed-loop streams, entries in order, as perf_analyzer
sends them.
"""

import asyncio
import itertools
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lora_serving.request_inputs import RawRequest
from lora_tools.bench.stats import RequestRecord

# What the launcher gives tritonserver's environment (lora_serving.launcher.server_environment).
ENGINE_ENVIRONMENT = {
    "VLLM_PLUGINS": "lora_serving",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}


def raw_request(entry: dict) -> RawRequest:
    """One perf_analyzer input-data entry -> the RawRequest Triton would hand our task (batch
    dimension 1; JSON bools/ints/floats/strings -> BOOL/INT32/FP32/BYTES as in config.pbtxt)."""
    tensors = {}
    for name, tensor in entry.items():
        content, shape = tensor["content"], tensor["shape"]
        first = content[0]
        if isinstance(first, bool):
            array = np.array(content, dtype=np.bool_)
        elif isinstance(first, int):
            array = np.array(content, dtype=np.int32)
        elif isinstance(first, float):
            array = np.array(content, dtype=np.float32)
        elif isinstance(first, str):
            array = np.array([item.encode() for item in content], dtype=object)
        else:
            raise ValueError(f"input {name}: unsupported content {type(first).__name__}")
        tensors[name] = array.reshape([1, *shape])
    return RawRequest(tensors)


@dataclass
class PreparedRequest:
    prompt: Any
    sampling: dict[str, Any]
    lora_request: Any
    stream: bool


class InProcessEngine:
    """An AsyncLLM on its own event-loop thread (as EngineHost runs it), driven by the bench."""

    def __init__(self, model_json: Path, task: str):
        from lora_serving import dtype_choice
        from lora_serving.adapters.catalog import AdapterCatalog
        from lora_serving.settings import EngineSettings
        from lora_serving.tasks import load_tokenizer, task_class

        settings = EngineSettings.from_file(model_json)
        configured = settings.engine_args.get("dtype")
        settings = settings.with_engine_args(dtype_choice.override(os.environ, configured))
        kind = task_class(task)
        self.settings = settings.with_engine_args(kind.engine_overrides(settings))
        catalog = AdapterCatalog.from_multi_lora_json(
            self.settings.multi_lora_path if self.settings.multi_lora_path.exists() else None,
            enabled=self.settings.lora_enabled,
            max_lora_rank=self.settings.max_lora_rank,
        )
        self.catalog = catalog
        self.task = kind(self.settings, catalog, load_tokenizer(self.settings.engine_args["model"]))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._engine = None
        self._ids = itertools.count()

    def _call(self, coroutine, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def start(self, timeout_s: float = 900.0) -> float:
        """Start the engine; returns the seconds it took."""
        for key, value in ENGINE_ENVIRONMENT.items():
            os.environ.setdefault(key, value)
        os.environ.update(self.settings.environment)
        self._thread.start()
        started = time.monotonic()

        async def create():
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            return AsyncLLM.from_engine_args(AsyncEngineArgs(**self.settings.engine_args))

        self._engine = self._call(create(), timeout_s)
        return time.monotonic() - started

    def prepare(self, data: dict) -> list[PreparedRequest]:
        """Each input-data entry -> the engine request our Triton model would send for it."""
        from lora_serving.tasks.whisper_job import TranscriptionJob

        prepared = []
        for entry in data["data"]:
            plan = self.task.build_plan(raw_request(entry))
            if len(plan.jobs) != 1:
                raise ValueError("bench entries carry one batch row each")
            job = plan.jobs[0]
            if isinstance(job, TranscriptionJob):  # whisper: one engine request per 30 s window
                if job.prompts is None:
                    raise ValueError("bench entries must not need language detection (give one)")
                samples = job.samples
                if samples.size > 30 * 16_000:
                    raise ValueError("bench clips must fit one 30 s window")
                prompt, sampling = self.task.request_for(job, samples)
            else:
                prompt, sampling = job.prompt, job.sampling
            lora = job.adapter.to_lora_request() if job.adapter is not None else None
            prepared.append(PreparedRequest(prompt, dict(sampling), lora, plan.stream))
        return prepared

    def run(
        self, prepared: list[PreparedRequest], *, concurrency: int, request_count: int
    ) -> list[RequestRecord]:
        """`request_count` requests, `concurrency` closed-loop streams, entries in order."""
        return self._call(self._run(prepared, concurrency, request_count))

    async def _run(self, prepared, concurrency: int, request_count: int) -> list[RequestRecord]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        counter = itertools.count()
        records: list[RequestRecord] = []

        async def stream():
            while (index := next(counter)) < request_count:
                request = prepared[index % len(prepared)]
                kind = RequestOutputKind.FINAL_ONLY
                if request.stream:  # as EngineHost: cumulative outputs while streaming
                    kind = RequestOutputKind.CUMULATIVE
                params = SamplingParams(**request.sampling, output_kind=kind)
                start = time.time()
                first, responses = None, 0
                async for _ in self._engine.generate(
                    request.prompt,
                    params,
                    f"bench-{next(self._ids)}",
                    lora_request=request.lora_request,
                ):
                    now = time.time()
                    first = first if first is not None else now
                    responses += 1
                records.append(RequestRecord(start, first, now, responses))

        await asyncio.gather(*(stream() for _ in range(concurrency)))
        return records

    def add_loras(self, lora_requests: list) -> None:
        async def add():
            for request in lora_requests:
                await self._engine.add_lora(request)

        self._call(add())

    def process_ids(self) -> list[int]:
        """The engine's own processes (EngineCore, its worker), not those of a tritonserver
        this process also started."""
        from lora_tools.bench.processes import engine_processes

        found = engine_processes(os.getpid())
        return [pid for role, pid in found.items() if role != "frontend"]

    def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
