"""How far int8 (W8A8) arithmetic itself moves Whisper's log-probabilities, with no int8 kernel.

`python -m lora_tools.bench.int8_emulation [--adapter all_layers] [--sentences 12]`

The bounds of tests/engine/test_whisper_int8.py come from this. transformers runs whisper-base
with each linear layer of the demo's int8 checkpoint as vLLM computes it (input rounded per
token to int8, symmetric; product of the int8 values exact, in float64; times both scales;
output in the model's type), the adapter unmerged as vLLM adds it. The float32 merged-weights
reference decodes each espeak-ng sentence greedily; every configuration is fed those tokens,
and the distance of each token's log-probability from the reference's is printed per
configuration (float32 + int8, bf16, bf16 + int8), with how often and at what reference margin
the configuration's own top choice differs.
"""

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SENTENCES = (
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Please send the quarterly report to the finance team by Friday afternoon.",
    "A large storm is expected to reach the northern coast tomorrow night.",
    "She opened the window and listened to the birds singing in the garden.",
    "Our new medication reduced the symptoms in most of the patients we studied.",
    "The museum will be closed on Monday while the workers repair the roof.",
    "He bought three apples, two oranges and a loaf of fresh bread.",
    "Turn left at the second traffic light and park behind the library.",
    "The committee approved the budget after a long and heated debate.",
    "Children under twelve must be accompanied by an adult at all times.",
    "The train to Boston leaves from platform nine at half past seven.",
    "Scientists measured the temperature of the lake every hour for a week.",
)
PROMPT = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")
MAX_TOKENS = 24


def w8a8_forward(weight_q, weight_scale, bias):
    """A linear layer's forward as vLLM's int8 kernels compute it (exactly, in float64)."""
    import torch

    weight_q = weight_q.double()
    weight_scale = weight_scale.double().reshape(-1, 1)

    def forward(x):
        wide = x.double()
        scale = wide.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
        x_q = torch.round(wide / scale).clamp(-127, 127)
        out = ((x_q @ weight_q.T) * scale * weight_scale.T).to(x.dtype)
        return out if bias is None else out + bias

    return forward


def emulated_model(base_dir: Path, int8_dir: Path, adapter_dir: Path | None, dtype, int8: bool):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration.from_pretrained(str(base_dir), dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, str(adapter_dir))
    model = model.to(dtype).eval()
    if not int8:
        return model
    quantized = load_file(str(int8_dir / "model.safetensors"))
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or "lora_" in name:
            continue
        key = name.replace("base_model.model.", "").replace(".base_layer", "") + ".weight"
        if key in quantized:
            scale = quantized[key.replace(".weight", ".weight_scale")]
            module.forward = w8a8_forward(quantized[key], scale, module.bias)
    return model


def merged_float32_model(base_dir: Path, adapter_dir: Path | None):
    """The float32 model with the adapter merged by PEFT: the judge of each configuration. Built
    here rather than taken from tests/reference/ (tooling never imports the tests); the
    window is the served padding (padded_features), the input the engine sees."""
    import torch
    from peft import PeftModel
    from transformers import WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration.from_pretrained(str(base_dir), dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    return model.eval()


def step_logprobs(model, features, prompt: list[int], tokens: list[int]):
    import torch

    dtype = next(model.parameters()).dtype
    with torch.inference_mode():
        logits = model(
            input_features=features.to(dtype),
            decoder_input_ids=torch.tensor([prompt + tokens[:-1]]),
        ).logits
    return torch.log_softmax(logits[0, len(prompt) - 1 :].float(), dim=-1)


def measure(demo_models: Path, adapter: str | None, sentences: int) -> dict[str, dict]:
    import torch
    from transformers import AutoTokenizer, WhisperFeatureExtractor

    from lora_serving.audio import decode_audio_file, to_whisper_input
    from lora_serving.vllm_plugin.whisper_feature_padding import padded_features

    base_dir = (demo_models / "whisper-base").absolute()
    adapter_dir = None if adapter is None else (demo_models / "whisper-adapters" / adapter)
    configs = {
        "float32+int8": (torch.float32, True),
        "bf16": (torch.bfloat16, False),
        "bf16+int8": (torch.bfloat16, True),
    }
    models = {
        name: emulated_model(base_dir, demo_models / "whisper-base-int8", adapter_dir, *config)
        for name, config in configs.items()
    }
    reference = merged_float32_model(base_dir, adapter_dir)
    extractor = WhisperFeatureExtractor.from_pretrained(str(base_dir))
    prompt = AutoTokenizer.from_pretrained(str(base_dir)).convert_tokens_to_ids(list(PROMPT))
    results = {
        name: {"distances": [], "sentence_means": [], "moved_margins": []} for name in configs
    }
    with tempfile.TemporaryDirectory() as folder:
        for index, text in enumerate(SENTENCES[:sentences]):
            wav = Path(folder) / f"{index}.wav"
            subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(wav), text], check=True)
            samples, rate = decode_audio_file(wav.read_bytes(), max_seconds=30)
            features = padded_features(extractor, to_whisper_input(samples, rate, max_seconds=30))
            with torch.inference_mode():
                generated = reference.generate(
                    input_features=features,
                    decoder_input_ids=torch.tensor([prompt]),
                    max_new_tokens=MAX_TOKENS,
                    do_sample=False,
                    suppress_tokens=None,  # plain greedy, as the engine test serves
                    begin_suppress_tokens=None,
                )
            sequences = getattr(generated, "sequences", generated)
            tokens = sequences[0, len(prompt) :].tolist()
            steps, chosen = torch.arange(len(tokens)), torch.tensor(tokens)
            ref = step_logprobs(reference, features, prompt, tokens)
            for name, model in models.items():
                emulated = step_logprobs(model, features, prompt, tokens)
                distance = (emulated[steps, chosen] - ref[steps, chosen]).abs()
                margin = ref[steps].max(-1).values - ref[steps, emulated[steps].argmax(-1)]
                results[name]["distances"] += distance.tolist()
                results[name]["sentence_means"].append(float(distance.mean()))
                results[name]["moved_margins"] += margin[margin > 0].tolist()
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-models", type=Path, default=Path("demo_models"))
    parser.add_argument("--adapter", default="all_layers", help="'none' for the base model")
    parser.add_argument("--sentences", type=int, default=len(SENTENCES))
    args = parser.parse_args(argv)
    adapter = None if args.adapter == "none" else args.adapter
    for name, result in measure(args.demo_models, adapter, args.sentences).items():
        distances = np.array(result["distances"])
        p50, p90, p99 = np.percentile(distances, [50, 90, 99])
        margins = result["moved_margins"]
        print(
            f"{args.adapter} {name}: {distances.size} steps, |dlogprob| p50 {p50:.3f} "
            f"p90 {p90:.3f} p99 {p99:.3f} max {distances.max():.3f} mean {distances.mean():.3f}, "
            f"worst sentence mean {max(result['sentence_means']):.3f}; top choice moved "
            f"{len(margins)} times, reference margin up to {max(margins, default=0):.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
