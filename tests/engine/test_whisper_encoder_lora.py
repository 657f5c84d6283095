"""Regression test (real engine): Whisper LoRA on the encoder and the cross-attention kv_proj.

vLLM 0.32 gives every Whisper LoRA layer the decoder's token mapping, so an adapter on encoder
layers or on `encoder_attn.kv_proj` kills the engine (defect 2). Our plugin module
`lora_serving.vllm_plugin.whisper_encoder_lora` routes those layers through vLLM's tower LoRA
mapping. One engine, with all four adapter kinds registered, serves the whole matrix: each kind
alone and mixed with base and the other kinds, token for token against the PEFT-merged float32
reference. A second, short-lived engine shows the start-up refusal without the tower flag.

Nothing here is CPU-specific: scripts/gpu_check.sh runs this file on a CUDA machine.
"""

import gc
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
# The real multilingual Whisper tokenizer and feature extractor (built by `make setup`).
WHISPER_BASE = REPO / "demo_models" / "whisper-base"
SAMPLE_RATE = 16_000
MAX_TOKENS = 12
LOGPROB_TOKENS, LOGPROB_TOLERANCE = 5, 1e-3
SUBPROCESS_TIMEOUT_S = 300

# PEFT matches a string target_modules as a full regex on module names.
ENCODER_TARGETS = (
    r"model\.encoder\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|out_proj)|fc1|fc2)"
)
CROSS_KV_TARGETS = r"model\.decoder\.layers\.\d+\.encoder_attn\.(k_proj|v_proj)"
DECODER_TARGETS = (
    r"model\.decoder\.layers\.\d+\."
    r"(self_attn\.(q_proj|k_proj|v_proj|out_proj)|encoder_attn\.(q_proj|out_proj)|fc1|fc2)"
)
ADAPTER_TARGETS = {
    "encoder": ENCODER_TARGETS,
    "cross_kv": CROSS_KV_TARGETS,
    "decoder": DECODER_TARGETS,
    "all": f"({ENCODER_TARGETS})|({CROSS_KV_TARGETS})|({DECODER_TARGETS})",
}
ADAPTER_KINDS = tuple(ADAPTER_TARGETS)


@dataclass(frozen=True)
class TinyWhisper:
    base_dir: Path
    adapter_dirs: dict[str, Path]
    prompts: dict[str, tuple[int, ...]]  # decoder prompts of different lengths


@dataclass(frozen=True)
class Case:
    """One request: adapter kind (None = base model), which audio, which decoder prompt."""

    adapter: str | None
    audio_seed: int
    prompt: str

    @property
    def label(self) -> str:
        return f"{self.adapter or 'base'}/audio{self.audio_seed}/{self.prompt}"


# Each kind alone (base as the control), then everything in one submission. The mixed list
# shares audio across adapters (the encoder cache must keep them apart), repeats adapters
# with other audio, and is submitted longest decoder prompt first: MRV2 sorts a step's batch by
# scheduled tokens, so its encoding order differs from submission order (see the plugin).
ALONE = [Case(kind, seed, "task") for seed, kind in enumerate((None, *ADAPTER_KINDS), start=1)]
MIXED = [
    Case("all", 1, "forced_text"),
    Case("encoder", 2, "forced_text"),
    Case(None, 3, "task"),
    Case("cross_kv", 1, "task"),
    Case("decoder", 4, "task"),
    Case("all", 5, "task"),
    Case("encoder", 1, "start"),
    Case(None, 2, "start"),
    Case("cross_kv", 3, "start"),
    Case("decoder", 2, "start"),
]


def synthetic_audio(seed: int) -> np.ndarray:
    """A distinct 1-4 s tone plus noise per seed, so swapped requests would show."""
    rng = np.random.default_rng(seed)
    t = np.arange(SAMPLE_RATE * (1 + seed % 4)) / SAMPLE_RATE
    tone = 0.3 * np.sin(2 * np.pi * (200 + 100 * seed) * t)
    return (tone + 0.1 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory) -> TinyWhisper:
    """A random 2+2-layer Whisper (d_model 64, one head: head_dim 64 for CPU attention) with the
    real tokenizer, and one rank-8 adapter per kind.

    Full 30 s encoder windows (1500 frames) as in real Whisper. init_std 0.2 gives greedy
    choices clear margins; LoRA B is random (PEFT starts it at zero, i.e. no delta).
    """
    from peft import LoraConfig, get_peft_model
    from tokenizers import Tokenizer
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    assert WHISPER_BASE.is_dir(), f"{WHISPER_BASE} is missing: run `make setup`"
    root = tmp_path_factory.mktemp("tiny_whisper")
    base_dir = root / "base"
    config = json.loads((WHISPER_BASE / "config.json").read_text())
    for key in ("suppress_tokens", "begin_suppress_tokens", "transformers_version", "dtype"):
        config.pop(key, None)
    config.update(
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=1,
        decoder_attention_heads=1,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_target_positions=64,
        init_std=0.2,
    )
    torch.manual_seed(0)
    WhisperForConditionalGeneration(WhisperConfig(**config)).save_pretrained(base_dir)
    (base_dir / "generation_config.json").unlink(missing_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"):
        shutil.copy(WHISPER_BASE / name, base_dir / name)

    adapter_dirs = {}
    for seed, (kind, targets) in enumerate(ADAPTER_TARGETS.items(), start=1):
        torch.manual_seed(seed)
        base = WhisperForConditionalGeneration.from_pretrained(base_dir)
        peft_model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.normal_(std=0.1)
        adapter_dirs[kind] = root / kind
        peft_model.save_pretrained(adapter_dirs[kind])

    tokenizer = Tokenizer.from_file(str(base_dir / "tokenizer.json"))
    special = {name: tokenizer.token_to_id(f"<|{name}|>") for name in ("startoftranscript", "en")}
    task = (
        special["startoftranscript"],
        special["en"],
        tokenizer.token_to_id("<|transcribe|>"),
        tokenizer.token_to_id("<|notimestamps|>"),
    )
    # vLLM puts <|startoftranscript|> (decoder_start_token_id) first in every decoder prompt,
    # so the long prompt forces text after the task tokens instead of using <|startofprev|>.
    forced_text = tokenizer.encode(" hello there world", add_special_tokens=False).ids
    prompts = {
        "start": (special["startoftranscript"],),
        "task": task,
        "forced_text": (*task, *forced_text),
    }
    return TinyWhisper(base_dir, adapter_dirs, prompts)


@pytest.fixture(scope="module")
def engine(tiny_whisper):
    """The one engine of the matrix: all adapters registered, tower LoRA on.

    max_num_batched_tokens 5000 lets one step encode three 1500-frame audios, so encoder steps
    with several requests and steps mixing prefills and decodes both occur.
    """
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # probes sent by collective_rpc
    started = time.monotonic()
    llm = LLM(
        model=str(tiny_whisper.base_dir),
        dtype="float32",
        enforce_eager=True,
        enable_lora=True,
        enable_tower_connector_lora=True,
        max_loras=len(ADAPTER_KINDS),
        max_lora_rank=8,
        max_model_len=64,
        max_num_seqs=16,
        max_num_batched_tokens=5000,
        limit_mm_per_prompt={"audio": 1},
        seed=0,
    )
    print(f"\nengine start: {time.monotonic() - started:.1f} s")
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def lora_request(model: TinyWhisper, kind: str | None) -> LoRARequest | None:
    """Stable ids: the kind's position + 1 (vLLM reserves 0)."""
    if kind is None:
        return None
    return LoRARequest(kind, ADAPTER_KINDS.index(kind) + 1, str(model.adapter_dirs[kind]))


def engine_prompt(model: TinyWhisper, case: Case) -> dict:
    return {
        "encoder_prompt": {
            "prompt": "",
            "multi_modal_data": {"audio": (synthetic_audio(case.audio_seed), SAMPLE_RATE)},
        },
        "decoder_prompt": {"prompt_token_ids": list(model.prompts[case.prompt])},
    }


def generate(llm, model: TinyWhisper, cases: list[Case]) -> list[tuple[list[int], list[float]]]:
    """Greedy tokens and each token's logprob, for all cases submitted at once."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=0)
    outputs = llm.generate(
        [engine_prompt(model, case) for case in cases],
        params,
        lora_request=[lora_request(model, case.adapter) for case in cases],
        use_tqdm=False,
    )
    results = []
    for output in outputs:
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        logprobs = [
            step[token].logprob for step, token in zip(completion.logprobs, tokens, strict=True)
        ]
        results.append((tokens, logprobs))
    return results


@cache
def _reference(base_dir: Path, adapter_dir: Path | None, case: Case, prompt: tuple[int, ...]):
    # Imported here: this file also runs as a script (__main__ below), where tests/ is not
    # importable.
    from tests.reference.whisper import greedy_without_rules

    return greedy_without_rules(  # bare vLLM: no Whisper decoding rules on either side
        base_dir, adapter_dir, synthetic_audio(case.audio_seed), list(prompt), MAX_TOKENS
    )


def reference(model: TinyWhisper, case: Case) -> tuple[list[int], list[float]]:
    adapter_dir = model.adapter_dirs[case.adapter] if case.adapter else None
    return _reference(model.base_dir, adapter_dir, case, model.prompts[case.prompt])


def compare_with_reference(
    model: TinyWhisper, cases: list[Case], results: list[tuple[list[int], list[float]]]
) -> float:
    """Assert tokens equal and early logprobs agree for every case; return the max logprob diff."""
    problems, max_diff = [], 0.0
    for case, (tokens, logprobs) in zip(cases, results, strict=True):
        expected_tokens, expected_logprobs = reference(model, case)
        if tokens != expected_tokens:
            problems.append(f"{case.label}: tokens {tokens} != reference {expected_tokens}")
            continue
        n = min(LOGPROB_TOKENS, len(tokens))
        diff = float(np.max(np.abs(np.subtract(logprobs[:n], expected_logprobs[:n]))))
        max_diff = max(max_diff, diff)
        if diff > LOGPROB_TOLERANCE:
            problems.append(f"{case.label}: logprob diff {diff:.2e} > {LOGPROB_TOLERANCE}")
    assert not problems, "\n".join(problems)
    return max_diff


# Runs first, before the module's engine exists: one engine at a time.
def test_engine_without_tower_flag_refuses_kv_proj_on_the_decoder_mapping(tiny_whisper):
    """Without enable_tower_connector_lora and without lora_target_modules, the plugin stops the
    engine at start-up instead of letting the first adapter request crash it (kv_proj would get
    the decoder's mapping). In a subprocess: a failed start must leave nothing in this one."""
    completed = subprocess.run(
        [sys.executable, __file__, "start-without-tower-flag", str(tiny_whisper.base_dir)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    log = completed.stdout + completed.stderr
    assert completed.returncode != 0, log[-3000:]
    assert "Whisper LoRA without enable_tower_connector_lora" in log, log[-3000:]


def test_adapters_change_the_reference(tiny_whisper):
    """Guards the matrix against passing vacuously: every kind changes the greedy output."""
    for kind in ADAPTER_KINDS:
        for seed in (1, 2):
            base = reference(tiny_whisper, Case(None, seed, "task"))
            adapted = reference(tiny_whisper, Case(kind, seed, "task"))
            assert adapted[0] != base[0], f"{kind} adapter leaves audio{seed} unchanged"


@pytest.mark.parametrize("case", ALONE, ids=lambda case: case.label)
def test_request_alone_matches_merged_reference(engine, tiny_whisper, case):
    max_diff = compare_with_reference(tiny_whisper, [case], generate(engine, tiny_whisper, [case]))
    print(f"\n{case.label} alone: max |logprob diff| {max_diff:.1e}")


def test_mixed_batch_matches_merged_reference(engine, tiny_whisper):
    engine.collective_rpc(install_cross_attention_probe)
    try:
        started = time.monotonic()
        results = generate(engine, tiny_whisper, MIXED)
        seconds = time.monotonic() - started
        records = engine.collective_rpc(collect_cross_attention_probe)[0]
    finally:
        engine.collective_rpc(remove_cross_attention_probe)

    max_diff = compare_with_reference(tiny_whisper, MIXED, results)
    audios_per_encoder_step = [rows // 1500 for layer, rows, _ in records if layer == 0 and rows]
    print(
        f"\nmixed batch of {len(MIXED)}: max |logprob diff| {max_diff:.1e}, {seconds:.1f} s, "
        f"audios per encoder step {audios_per_encoder_step}"
    )
    # The batch really exercised multi-audio encoder steps (kv_proj over stacked encoder rows).
    assert sum(audios_per_encoder_step) == len(MIXED)
    assert max(audios_per_encoder_step) >= 2


def test_cross_attention_cache_gets_adapted_kv_once(engine, tiny_whisper, tmp_path):
    """kv_proj runs once per request, in its encoder step, and what it hands the cross-attention
    cache write is the adapter's k/v (merged reference), not the base's. Every later step reads
    K/V only from that cache (key is None), and those steps' tokens match the reference."""
    case = Case("cross_kv", 6, "task")
    engine.collective_rpc(install_cross_attention_probe, kwargs={"tensor_dir": str(tmp_path)})
    try:
        [(tokens, logprobs)] = generate(engine, tiny_whisper, [case])
        records = engine.collective_rpc(collect_cross_attention_probe)[0]
    finally:
        engine.collective_rpc(remove_cross_attention_probe)

    compare_with_reference(tiny_whisper, [case], [(tokens, logprobs)])
    adapted = merged_cross_kv(tiny_whisper, "cross_kv", case.audio_seed)
    base = merged_cross_kv(tiny_whisper, None, case.audio_seed)
    for layer, (adapted_kv, base_kv) in enumerate(zip(adapted, base, strict=True)):
        calls = [record for record in records if record[0] == layer]
        writes = [record for record in calls if record[1]]
        assert len(writes) == 1, f"layer {layer}: {len(writes)} cache writes"
        assert len(calls) - len(writes) == len(tokens) - 1  # every decode step read the cache
        _, rows, path = writes[0]
        assert rows == 1500
        key, value = torch.load(path)
        for name, written, expected, stale in (
            ("key", key, adapted_kv[0], base_kv[0]),
            ("value", value, adapted_kv[1], base_kv[1]),
        ):
            error = float((written - expected).abs().max())
            delta = float((expected - stale).abs().max())
            print(f"\nlayer {layer} cached {name}: error {error:.1e}, adapter delta {delta:.2f}")
            assert error < 1e-3 * delta, f"layer {layer} {name}: error {error}, delta {delta}"


def merged_cross_kv(model: TinyWhisper, kind: str | None, audio_seed: int):
    """Per decoder layer, (k, v) of the cross-attention over this audio, adapter merged in."""
    from peft import PeftModel
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    from lora_serving.vllm_plugin.whisper_feature_padding import padded_features

    whisper = WhisperForConditionalGeneration.from_pretrained(model.base_dir, dtype=torch.float32)
    if kind is not None:
        whisper = PeftModel.from_pretrained(whisper, model.adapter_dirs[kind]).merge_and_unload()
    features = padded_features(  # as the engine pads a short window (our plugin)
        WhisperFeatureExtractor.from_pretrained(model.base_dir), synthetic_audio(audio_seed)
    )
    with torch.inference_mode():
        encoded = whisper.get_encoder()(features).last_hidden_state[0]
        return [
            (layer.encoder_attn.k_proj(encoded), layer.encoder_attn.v_proj(encoded))
            for layer in whisper.model.decoder.layers
        ]


# ---- worker-side probes (run inside the vLLM worker through collective_rpc) --------------------
def install_cross_attention_probe(worker, tensor_dir: str | None = None) -> None:
    """Record every cross-attention call as (layer, K/V rows handed to the cache write, file);
    with tensor_dir, save those K/V there (tensors do not survive the RPC reply)."""
    records = []
    worker.cross_attention_probe = records

    def recording(index: int, upstream_forward):
        def forward(attention, query, key, value, *args, **kwargs):
            rows = 0 if key is None else key.shape[0]
            path = None
            if tensor_dir is not None and key is not None:
                path = f"{tensor_dir}/layer{index}_call{len(records)}.pt"
                kv = (key.reshape(rows, -1).cpu(), value.reshape(rows, -1).cpu())
                torch.save(kv, path)
            records.append((index, rows, path))
            return upstream_forward(attention, query, key, value, *args, **kwargs)

        return forward

    for index, layer in enumerate(worker.model_runner.model.model.decoder.layers):
        impl = layer.encoder_attn.attn.impl
        impl.forward = recording(index, impl.forward)


def collect_cross_attention_probe(worker) -> list:
    return list(worker.cross_attention_probe)


def remove_cross_attention_probe(worker) -> None:
    for layer in worker.model_runner.model.model.decoder.layers:
        layer.encoder_attn.attn.impl.__dict__.pop("forward", None)
    worker.cross_attention_probe = []


def start_without_tower_flag(base_dir: str) -> None:
    """Subprocess side of the refusal test: the engine start is expected to raise."""
    LLM(
        model=base_dir,
        dtype="float32",
        enforce_eager=True,
        enable_lora=True,
        max_loras=1,
        max_lora_rank=8,
        max_model_len=64,
        limit_mm_per_prompt={"audio": 1},
    )


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    assert command == "start-without-tower-flag", command
    start_without_tower_flag(*arguments)
