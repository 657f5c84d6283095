"""Real engine: whisper-base with int8 linear layers (`make serve WEIGHTS=int8`) serves LoRA.

vLLM's CPU int8 GEMM keeps the packed weight itself and leaves `layer.weight = None`, which
vLLM's LoRA wrappers cannot start with; our plugin (vllm_plugin.cpu_int8_lora) fixes that. A
base request and an all-layer adapter request (encoder, cross-attention k/v, decoder) share one
batch, at float32 and at bf16 (`DTYPE=bfloat16 WEIGHTS=int8`, the fastest CPU setting). Each CPU
kind takes another int8 kernel, and two needed a fix of ours to serve at all or serve right:
with AMX vLLM's SGL kernel (vllm_plugin.cpu_int8_amx), without VNNI oneDNN's, whose int16 sums
saturate (vllm_plugin.cpu_int8_no_vnni: such a CPU serves the dequantized weights).

The judge is the float32 reference on the merged weights, within what int8 arithmetic costs:
the served tokens are fed to it, and at every step the served token must be its choice or within
NEAR_TIE of it in log-probability, the served log-probability within STEP_TOLERANCE of its own,
and their mean distance over the request within MEAN_TOLERANCE. Not token for token, and the
bounds come from a measured distribution, not from this sentence. The first version held every
step within 0.25, measured here on an Intel AMX machine (~0.12); on an AMD EPYC with AVX-512
(oneDNN's VNNI kernel) one bf16 step of the all-layer adapter came out 0.38 from the reference.
The same W8A8 arithmetic emulated without any kernel (transformers on the int8 checkpoint's
weights, inputs rounded per token as vLLM does, products exact, the adapter's product unmerged)
over 12 espeak-ng sentences, base and all-layer adapter, 231 steps (2026-12-04): at float32 a
step is up to 0.75 from the reference (p99 0.62 adapter, 0.38 base; the adapter's worst
sentence mean 0.14) and the reference's choice moved at margins up to 0.37; at bf16 with int8
up to 1.29 (p99 0.82 adapter, 0.36 base; worst sentence mean 0.19); bf16 alone, up to 0.19
(`python -m lora_tools.bench.int8_emulation` prints these). So 0.38 is int8 arithmetic (at
bf16 its rounding compounds), not a defect of ours: vLLM adds the adapter's product from a
float32 shrink, and the no-adapter request drifts as much as the adapter's. int8 rounding also
amplifies the last-bit differences between implementations, so no emulation is a tighter judge
than the float32 reference. The adapter's tokens must meet the adapter's reference and not the
base's.
"""

import gc

import pytest
import torch
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest

from lora_tools.demo import int8
from tests.conftest import load_16k

pytestmark = pytest.mark.engine

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."
PROMPT = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")
MAX_TOKENS = 24
# From the emulated distribution above (worst: margin 0.37, step 1.29, sentence mean 0.19).
NEAR_TIE = 0.5
STEP_TOLERANCE = 1.5
MEAN_TOLERANCE = 0.25
ADAPTER = "all_layers"
EOT = 50257  # <|endoftext|>  # encoder, cross-attention k/v and decoder modules


@pytest.fixture(scope="module")
def int8_whisper(demo_models, tmp_path_factory):
    """The demo's int8 copy, rebuilt here from whisper-base (the build is idempotent)."""
    built = demo_models / "whisper-base-int8"
    assert built.is_dir(), "demo_models/whisper-base-int8 missing: run `make setup`"
    fresh = int8.quantize_checkpoint(
        demo_models / "whisper-base", tmp_path_factory.mktemp("int8") / "whisper-base-int8"
    )
    assert (fresh / "model.safetensors").read_bytes() == (built / "model.safetensors").read_bytes()
    return built


@pytest.fixture(scope="module")
def audio(speech):
    return load_16k(speech(SENTENCE))


def prompt_ids(model_dir) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return tokenizer.convert_tokens_to_ids(list(PROMPT))


def served(int8_dir, adapter_dir, audio, dtype) -> list[tuple[list[int], list[float]]]:
    """Greedy tokens and their log-probabilities for [base, adapter], submitted together."""
    llm = LLM(
        model=str(int8_dir),
        dtype=dtype,
        enforce_eager=True,
        enable_lora=True,
        enable_tower_connector_lora=True,
        max_loras=1,
        max_lora_rank=16,
        max_model_len=448,
        max_num_seqs=4,
        limit_mm_per_prompt={"audio": 1},
        seed=0,
    )
    try:
        prompt = {
            "encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (audio, 16_000)}},
            "decoder_prompt": {"prompt_token_ids": prompt_ids(int8_dir)},
        }
        outputs = llm.generate(
            [prompt, prompt],
            SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=0),
            lora_request=[None, LoRARequest(ADAPTER, 1, str(adapter_dir))],
            use_tqdm=False,
        )
        results = []
        for output in outputs:
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            logprobs = [
                step[token].logprob
                for step, token in zip(completion.logprobs, tokens, strict=False)
            ]
            results.append((tokens, logprobs))
        return results
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def float32_reference(float_dir, adapter_dir, audio, tokens: list[int]) -> torch.Tensor:
    """Each step's log-probabilities over the vocabulary from the float32 merged reference,
    `tokens` fed one after another."""
    from tests.reference.whisper import _model_and_features

    model, features = _model_and_features(float_dir, adapter_dir, audio)
    prompt = prompt_ids(float_dir)
    with torch.inference_mode():
        logits = model(
            input_features=features, decoder_input_ids=torch.tensor([prompt + tokens[:-1]])
        ).logits
    return torch.log_softmax(logits[0, len(prompt) - 1 :].float(), dim=-1)


def disagreements(tokens, logprobs, reference) -> list[str]:
    problems = []
    distances = []
    for step, (token, logprob) in enumerate(zip(tokens, logprobs, strict=True)):
        best = int(reference[step].argmax())
        if float(reference[step, best] - reference[step, token]) > NEAR_TIE:
            problems.append(f"step {step}: served {token}, reference {best}")
        distances.append(abs(logprob - float(reference[step, token])))
        if distances[-1] > STEP_TOLERANCE:
            problems.append(
                f"step {step}: log-probability {logprob:.4f}, reference "
                f"{float(reference[step, token]):.4f}"
            )
    mean = sum(distances) / len(distances)
    if mean > MEAN_TOLERANCE:
        problems.append(f"mean log-probability distance {mean:.4f} over {len(distances)} steps")
    return problems


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_int8_engine_serves_base_and_adapter_within_int8_of_the_float32_reference(
    int8_whisper, demo_models, audio, dtype
):
    adapter_dir = demo_models / "whisper-adapters" / ADAPTER
    (base_tokens, base_logprobs), (adapter_tokens, adapter_logprobs) = served(
        int8_whisper, adapter_dir, audio, dtype
    )
    float_dir = demo_models / "whisper-base"
    base_reference = float32_reference(float_dir, None, audio, base_tokens)
    adapter_reference = float32_reference(float_dir, adapter_dir, audio, adapter_tokens)
    problems = [
        f"base {problem}" for problem in disagreements(base_tokens, base_logprobs, base_reference)
    ] + [
        f"{ADAPTER} {problem}"
        for problem in disagreements(adapter_tokens, adapter_logprobs, adapter_reference)
    ]
    assert not problems, "\n".join(problems)
    assert base_tokens[-1] == adapter_tokens[-1] == EOT  # both ended
    # The adapter is applied, not dropped: the base model would not have chosen its tokens.
    assert adapter_tokens != base_tokens
    base_on_adapter_tokens = float32_reference(float_dir, None, audio, adapter_tokens)
    assert disagreements(adapter_tokens, adapter_logprobs, base_on_adapter_tokens)
