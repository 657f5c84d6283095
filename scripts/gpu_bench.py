"""Short GPU throughput figures for `make gpu-check`: Whisper on vLLM with our plugin, the base
model alone vs. LoRA adapters of every kind mixed into the same batches.

Offline (vllm.LLM, no Triton, nothing built): demo_models/whisper-base in bfloat16 with the engine
arguments our whisper_lora model gets (model.json keys through EngineSettings and the task's
engine overrides: tower LoRA on, the timestamp logits processor loaded). Every request has its own
synthetic speech-like clip (so no encoder output is reused) and decodes exactly --max-tokens
tokens (ignore_eos), so both workloads do equal work:
  base   no adapter on any request;
  mixed  round-robin over no adapter and the demo adapters alpha (decoder), cross_kv (cross-
         attention k/v), encoder_only (encoder) and all_layers: every batch mixes all kinds.
The workloads alternate for --repeats rounds after a warm-up; medians are printed, then the
ratio mixed / base (the cost of multi-LoRA with encoder LoRA, on this GPU).

    python scripts/gpu_bench.py [--requests 256] [--repeats 3] [--seconds 5] [--max-tokens 32]
    python scripts/gpu_bench.py --dry-run     # build the requests and engine arguments only
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
WHISPER = REPO / "demo_models" / "whisper-base"
ADAPTERS = REPO / "demo_models" / "whisper-adapters"
MIXED = (None, "alpha", "cross_kv", "encoder_only", "all_layers")
SAMPLE_RATE = 16_000


def speech_like(seconds: float, seed: int) -> np.ndarray:
    """Deterministic voiced-sounding audio: harmonics under a syllable-rate envelope, float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    pitch = 100 + 60 * rng.random()
    wave = sum(np.sin(2 * np.pi * pitch * k * t) / k for k in range(1, 6))
    envelope = 0.5 * (1 + np.sin(2 * np.pi * 3.5 * t + 6 * rng.random()))
    return (0.1 * wave * envelope + 0.005 * rng.standard_normal(t.size)).astype(np.float32)


def engine_args(max_num_seqs: int, eager: bool) -> dict:
    """whisper_lora's engine arguments, built the way the served model builds them."""
    from lora_serving.settings import EngineSettings
    from lora_serving.tasks.transcription import TranscriptionTask

    model_json = {
        "model": str(WHISPER),
        "dtype": "bfloat16",
        "max_model_len": 448,
        "max_num_seqs": max_num_seqs,
        "limit_mm_per_prompt": {"audio": 1},
        "enable_lora": True,
        "enable_tower_connector_lora": True,
        "max_loras": len([name for name in MIXED if name]),
        "max_lora_rank": 16,
        "max_cpu_loras": 8,
        "gpu_memory_utilization": 0.5,
        "enforce_eager": eager,
        "seed": 0,
    }
    settings = EngineSettings.from_dict(model_json, model_dir=REPO, source="gpu_bench")
    settings = settings.with_engine_args(TranscriptionTask.engine_overrides(settings))
    return settings.engine_args


def task_prompt_ids() -> list[int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(WHISPER / "tokenizer.json"))
    tokens = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")
    return [tokenizer.token_to_id(token) for token in tokens]


def build_requests(count: int, seconds: float, first_seed: int) -> list[dict]:
    decoder = task_prompt_ids()
    return [
        {
            "encoder_prompt": {
                "prompt": "",
                "multi_modal_data": {"audio": (speech_like(seconds, seed), SAMPLE_RATE)},
            },
            "decoder_prompt": {"prompt_token_ids": list(decoder)},
        }
        for seed in range(first_seed, first_seed + count)
    ]


def lora_requests(count: int) -> dict[str, list]:
    from vllm.lora.request import LoRARequest

    adapters = {
        name: LoRARequest(name, position, str(ADAPTERS / name))
        for position, name in enumerate((n for n in MIXED if n), start=1)
    }
    return {
        "base": [None] * count,
        "mixed": [adapters.get(MIXED[index % len(MIXED)]) for index in range(count)],
    }


def run_once(llm, requests, loras, sampling) -> tuple[float, int]:
    started = time.perf_counter()
    outputs = llm.generate(requests, sampling, lora_request=loras, use_tqdm=False)
    elapsed = time.perf_counter() - started
    return elapsed, sum(len(output.outputs[0].token_ids) for output in outputs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="audio per request")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs / compilation")
    parser.add_argument("--dry-run", action="store_true", help="build everything, start nothing")
    args = parser.parse_args(argv)

    missing = [p for p in (WHISPER, *(ADAPTERS / n for n in MIXED if n)) if not p.is_dir()]
    if missing:
        sys.exit(f"gpu_bench: missing {', '.join(map(str, missing))}: run `make setup` first")

    from vllm import SamplingParams

    kwargs = engine_args(args.max_num_seqs, args.eager)
    sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    requests = build_requests(args.requests, args.seconds, first_seed=1000)
    warmup = build_requests(min(32, args.requests), args.seconds, first_seed=0)
    loras = lora_requests(args.requests)
    warmup_loras = lora_requests(len(warmup))
    print(
        f"gpu_bench: whisper-base bfloat16, {args.requests} requests x {args.seconds:g} s audio, "
        f"{args.max_tokens} tokens each, max_num_seqs {args.max_num_seqs}, "
        f"{'eager' if args.eager else 'CUDA graphs'}; mixed = round-robin over "
        f"{', '.join(name or 'base' for name in MIXED)}",
        flush=True,
    )
    if args.dry_run:
        print(f"gpu_bench: dry run, engine arguments {sorted(kwargs)}")
        return 0

    import torch
    from vllm import LLM
    from vllm.version import __version__

    started = time.perf_counter()
    llm = LLM(**kwargs)
    print(
        f"gpu_bench: vLLM {__version__} on {torch.cuda.get_device_name()}, engine start "
        f"{time.perf_counter() - started:.1f} s",
        flush=True,
    )
    try:
        for name in ("base", "mixed"):
            run_once(llm, warmup, warmup_loras[name], sampling)
        results: dict[str, list[tuple[float, int]]] = {"base": [], "mixed": []}
        for repeat in range(1, args.repeats + 1):
            for name in ("base", "mixed"):
                elapsed, tokens = run_once(llm, requests, loras[name], sampling)
                results[name].append((elapsed, tokens))
                print(
                    f"  repeat {repeat}: {name:5s} {elapsed:6.2f} s  "
                    f"{args.requests / elapsed:7.1f} req/s  {tokens / elapsed:8.0f} tok/s",
                    flush=True,
                )
    finally:
        llm.llm_engine.engine_core.shutdown()

    throughput = {}
    for name, runs in results.items():
        seconds = statistics.median(elapsed for elapsed, _ in runs)
        tokens = runs[0][1]
        throughput[name] = args.requests / seconds
        print(
            f"gpu_bench: {name:5s} (median of {len(runs)}): {throughput[name]:.1f} req/s, "
            f"{tokens / seconds:.0f} output tok/s, "
            f"{args.requests * args.seconds / seconds:.0f}x real time"
        )
    print(f"gpu_bench: mixed / base throughput = {throughput['mixed'] / throughput['base']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
