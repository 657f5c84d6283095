"""What `make bench` measures and how big: defaults sized for a 2-core CPU machine with the demo
models (the whole run in well under 30 minutes), every size and concurrency settable from a JSON
file (`--config`) or the command line for a bigger machine.

A config file holds any subset of the fields below, the per-model ones under "whisper" and
"qwen_vl", e.g. for one GPU:

    {"source_repository": "model_repository_gpu",
     "engine_overrides": {"dtype": "bfloat16"},
     "whisper": {"concurrencies": [1, 8, 32, 64], "main_concurrency": 32, "min_requests": 128},
     "qwen_vl": {"concurrencies": [1, 8, 32, 64], "main_concurrency": 32, "min_requests": 256},
     "hf_device": "cuda"}
"""

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lora_serving.launcher import REPO_ROOT

MODEL_KINDS = ("whisper", "qwen_vl")
# Parts of a run, in order: each model's figures, then word error rate vs faster-whisper (wer.py),
# then throughput vs faster-whisper (P7, whisper_speed.py), then word timings (word_timing.py).
PARTS = (*MODEL_KINDS, "wer", "speed", "words")
# Real Whisper sizes the wer part can compare (demo folders, lora_tools.demo.whisper).
WER_MODELS = ("whisper-base", "whisper-tiny.en")


@dataclass
class ModelBench:
    """Workload sizes for one model."""

    concurrencies: list[int]  # latency / TTFT / P1 sweep
    main_concurrency: int  # P2, P3, P5 are measured here
    min_requests: int  # sweep: requests per measurement at least ...
    requests_per_stream: int  # ... and at least this many per concurrent stream
    # P2 / P3 / P5 (phase A): requests per measurement (0: as the sweep at main_concurrency)
    phase_a_requests: int = 0
    # The sweep's workload: "mixed" (4 adapters round-robin) or "nolora" (no adapter, same
    # LoRA-enabled engine)
    sweep_workload: str = "mixed"
    # P1 also with non-streamed requests (one response each) at main_concurrency: how much of
    # the cost of Triton is the per-token streaming.
    p1_unstreamed: bool = False
    max_tokens: int = 32  # every request decodes exactly this many tokens (ignore_eos)
    clip_seconds: float = 5.0  # whisper: length of each clip
    image_size: tuple[int, int] = (224, 224)  # qwen_vl: width, height of each image
    # Engine arguments for this model only, on top of model.json and engine_overrides.
    engine_overrides: dict[str, Any] = field(default_factory=dict)

    def requests_at(self, concurrency: int) -> int:
        return max(self.min_requests, self.requests_per_stream * concurrency)

    @property
    def phase_a_count(self) -> int:
        return self.phase_a_requests or self.requests_at(self.main_concurrency)


def _default_whisper() -> ModelBench:
    # Whisper requests are slow on 2 CPU cores (the encoder runs 1500 frames per clip), so the
    # workloads are kept small; the latency sweep runs requests without an adapter, which P1
    # compares like for like (mixed adapters are measured in phase A). On a GPU set
    # "sweep_workload": "mixed" and larger sizes.
    return ModelBench(
        concurrencies=[1, 2, 4],
        main_concurrency=2,
        min_requests=8,
        requests_per_stream=3,
        phase_a_requests=4,
        sweep_workload="nolora",
    )


def _default_qwen() -> ModelBench:
    return ModelBench(
        concurrencies=[1, 4, 8],
        main_concurrency=8,
        min_requests=32,
        requests_per_stream=6,
        phase_a_requests=64,
        p1_unstreamed=True,
        # Repeated prompts would hit the prefix cache and skip prefill and the vision tower.
        engine_overrides={"enable_prefix_caching": False},
    )


@dataclass
class BenchConfig:
    models: list[str] = field(default_factory=lambda: list(PARTS))  # parts to run
    repeats: int = 3
    results_dir: Path = REPO_ROOT / "results"
    # Where config.pbtxt, model.py and model.json are copied from.
    source_repository: Path = REPO_ROOT / "model_repository"
    mixed_adapters: int = 4  # P2: this many adapters round-robin
    many_adapters: int = 32  # P3: this many adapters round-robin ...
    # ... through this many engine slots: qwen_vl's main concurrency, as a server sizes its
    # slots to the requests it runs at once (with fewer slots than requests in flight, P3
    # measures the slot limit, not adapter swapping) ...
    max_loras: int = 8
    max_cpu_loras: int = 32  # ... and this many cached in memory
    adapter_seed: int = 2024
    whisper_adapter_targets: str = "decoder"  # "decoder" or "all" (encoder, cross-attn k/v too)
    # Engine arguments for both models (on top of model.json), served and in-process alike.
    # The multimodal processor cache would turn repeated clips/images into cache hits.
    engine_overrides: dict[str, Any] = field(default_factory=lambda: {"mm_processor_cache_gb": 0})
    environment_overrides: dict[str, str] = field(default_factory=dict)
    whisper: ModelBench = field(default_factory=_default_whisper)
    qwen_vl: ModelBench = field(default_factory=_default_qwen)
    # P5: whisper_lora's real-time factor at this concurrency (requests without an adapter) ...
    p5_concurrency: int = 4
    p5_requests: int = 8
    # ... against the Hugging Face pipeline on the same clips: its device, batch sizes (the
    # first is P5's; the others are reported beside it) and torch threads (0: as many as cores
    # the whisper engine is bound to by VLLM_CPU_OMP_THREADS_BIND, so both get the same cores).
    hf_device: str = "cpu"
    hf_batch_sizes: list[int] = field(default_factory=lambda: [1, 4])
    hf_threads: int = 0
    # Word error rate vs faster-whisper ("wer" in models): faster-whisper's CTranslate2 threads
    # (0: as many as cores whisper_lora's engine is bound to).
    wer_threads: int = 0
    # ... and which real Whisper both sides run: "whisper-base" (model.json's) or
    # "whisper-tiny.en" (docs/models.md); each side on the same installed CTranslate2 weights.
    wer_model: str = "whisper-base"
    # P7 ("speed" in models): whisper_lora's requests in flight on the short clips, and the
    # dtypes it is served at, one tritonserver each (the first is P7's; bf16 ÷ float32 beside);
    # "<dtype>+int8" serves its int8 weights (serving.int8_model) at that dtype.
    speed_concurrency: int = 4
    speed_dtypes: list[str] = field(
        default_factory=lambda: ["float32", "bfloat16", "bfloat16+int8"]
    )
    # P6: adapters loaded into the in-process engine in `p6_batches` batches of `p6_batch_size`
    # after one warm-up adapter (each batch is one repetition).
    p6_batches: int = 3
    p6_batch_size: int = 8
    # py-spy on the processes behind a ratio that misses its goal (one extra measurement each).
    profile: bool = True
    profile_seconds: float = 8.0
    server_start_timeout_s: float = 900.0
    # A model or engine that fails to start (on a shared machine: usually memory taken by other
    # work at that moment) is tried again after this many seconds, once.
    start_retry_wait_s: float = 60.0
    # Before each measurement: the previous side's vLLM engine busy-polls for 1 s after its
    # last step (vLLM's own readers: GPU, or CPU with LORA_SERVING_MQ_SPIN_S set); wait this
    # long so it does not share the cores with the next side.
    settle_s: float = 1.2

    def model(self, kind: str) -> ModelBench:
        return getattr(self, kind)

    def check(self) -> list[str]:
        problems = []
        unknown = sorted(set(self.models) - set(PARTS))
        if unknown:
            problems.append(f"unknown models {unknown}; use {', '.join(PARTS)}")
        if self.repeats < 1:
            problems.append("repeats must be >= 1")
        if self.max_cpu_loras < self.many_adapters:
            problems.append(
                f"max_cpu_loras ({self.max_cpu_loras}) < many_adapters ({self.many_adapters}): "
                "P3 measures swapping between cached adapters, not loading from disk"
            )
        if self.max_loras < self.mixed_adapters:
            problems.append(f"max_loras ({self.max_loras}) < mixed_adapters")
        if self.p6_batches * self.p6_batch_size + 1 > self.max_cpu_loras:
            problems.append("P6 loads more adapters than max_cpu_loras holds")
        if self.p6_batches * self.p6_batch_size + 1 > self.many_adapters:
            problems.append("P6 loads more adapters than many_adapters are built")
        if not self.hf_batch_sizes or min(self.hf_batch_sizes) < 1:
            problems.append("hf_batch_sizes must be integers >= 1")
        if self.wer_model not in WER_MODELS:
            problems.append(f"wer_model must be one of {', '.join(WER_MODELS)}")
        if self.whisper_adapter_targets not in ("decoder", "all"):
            problems.append("whisper_adapter_targets must be 'decoder' or 'all'")
        for kind in MODEL_KINDS:
            spec = self.model(kind)
            if not spec.concurrencies or min(spec.concurrencies) < 1:
                problems.append(f"{kind}.concurrencies must be integers >= 1")
            if spec.main_concurrency < 1:
                problems.append(f"{kind}.main_concurrency must be >= 1")
            if spec.sweep_workload not in ("mixed", "nolora"):
                problems.append(f"{kind}.sweep_workload must be 'mixed' or 'nolora'")
        return problems

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        return json.loads(json.dumps(data, default=str))


def _merge(target, updates: dict, where: str) -> None:
    known = {f.name: f for f in dataclasses.fields(target)}
    for key, value in updates.items():
        if key not in known:
            raise ValueError(f"unknown bench setting '{where}{key}' (known: {', '.join(known)})")
        current = getattr(target, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ValueError(f"bench setting '{where}{key}' must be an object")
            _merge(current, value, f"{where}{key}.")
        elif isinstance(current, Path):
            path = Path(value)
            setattr(target, key, path if path.is_absolute() else REPO_ROOT / path)
        elif isinstance(current, tuple):
            setattr(target, key, tuple(value))
        elif isinstance(current, dict):  # merged; a null value removes a default key
            merged = {**current, **value}
            setattr(target, key, {k: v for k, v in merged.items() if v is not None})
        else:
            setattr(target, key, value)


def load_config(path: Path | None = None, overrides: dict | None = None) -> BenchConfig:
    """Defaults, then the JSON file, then `overrides` (same shape); problems raise ValueError."""
    config = BenchConfig()
    if path is not None:
        _merge(config, json.loads(Path(path).read_text()), "")
    if overrides:
        _merge(config, overrides, "")
    problems = config.check()
    if problems:
        raise ValueError("bench config: " + "; ".join(problems))
    return config
