"""Train a PEFT LoRA adapter for the served whisper-base on synthesised domain speech.

CPU cost is the encoder: whisper-base always encodes 30 s (1500 frames), and one encoder pass
costs about as much for a 3 s sentence as for 30 s of speech. So sentences are packed into
windows of up to `window_seconds` (as Whisper itself was trained on 30 s windows of continuous
speech), and everything below the first encoder layer that carries LoRA is computed once per
window, without gradients: for a decoder-only adapter that is the whole encoder.

Labels are what the server decodes: the prompt <|startoftranscript|><|en|><|transcribe|>
<|notimestamps|>, then " " + text and <|endoftext|>; the loss covers the text and the end.
"""

import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from lora_serving.vllm_plugin.whisper_feature_padding import padded_features
from lora_tools.demo.whisper import CROSS_KV_LORA_TARGETS, DECODER_LORA_TARGETS
from lora_tools.finetune.corpus import Utterance, load_16k, synthesise

SAMPLE_RATE = 16_000
GAP_SECONDS = 0.4  # silence between packed sentences
KINDS = ("decoder", "all_layers")
ENCODER_MODULES = r"(self_attn\.(q_proj|k_proj|v_proj|out_proj)|fc1|fc2)"
PROMPT_TOKENS = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")


@dataclass(frozen=True)
class TrainSettings:
    kind: str = "decoder"  # "decoder" or "all_layers" (encoder, cross-attention k/v, decoder)
    rank: int = 16
    alpha: int = 32
    learning_rate: float = 1e-3
    epochs: int = 6
    encoder_layers: int | None = None  # all_layers: LoRA on the last N encoder layers (None: all)
    window_seconds: float = 28.0
    seed: int = 0
    # torch threads. One by default: on this shared 2-core machine, two OpenMP threads that
    # wait on each other ran a decoder step 5-10x slower (10 s) than one thread (1-1.5 s).
    threads: int = 1

    def __post_init__(self):
        problems = []
        if self.kind not in KINDS:
            problems.append(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if min(self.rank, self.epochs, self.threads) < 1 or self.learning_rate <= 0:
            problems.append("rank, epochs, threads and learning_rate must be positive")
        if self.encoder_layers is not None and self.encoder_layers < 1:
            problems.append(f"encoder_layers must be >= 1, got {self.encoder_layers}")
        if not 1 <= self.window_seconds <= 30:
            problems.append(f"window_seconds must be within 1-30, got {self.window_seconds}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class Window:
    """Packed sentences: 16 kHz samples and their text, in order."""

    samples: np.ndarray
    text: str


@dataclass(frozen=True)
class TrainReport:
    adapter_dir: Path
    clips: int
    windows: int
    steps: int
    seconds: float
    first_loss: float
    last_loss: float


def pack_windows(
    clips: Sequence[tuple[np.ndarray, str]], window_seconds: float, gap_s: float = GAP_SECONDS
) -> list[Window]:
    """Consecutive clips joined with `gap_s` of silence into windows of at most window_seconds."""
    limit = int(window_seconds * SAMPLE_RATE)
    gap = np.zeros(int(gap_s * SAMPLE_RATE), np.float32)
    windows, parts, texts = [], [], []
    for samples, text in clips:
        if len(samples) > limit:
            raise ValueError(f"a clip of {len(samples) / SAMPLE_RATE:.1f} s exceeds the window")
        length = sum(len(p) for p in parts) + len(gap) * len(parts) + len(samples)
        if parts and length > limit:
            windows.append(Window(_join(parts, gap), " ".join(texts)))
            parts, texts = [], []
        parts.append(samples)
        texts.append(text)
    if parts:
        windows.append(Window(_join(parts, gap), " ".join(texts)))
    return windows


def _join(parts: list[np.ndarray], gap: np.ndarray) -> np.ndarray:
    joined = [parts[0]]
    for part in parts[1:]:
        joined += [gap, part]
    return np.concatenate(joined).astype(np.float32)


def lora_targets(kind: str, encoder_layers: int | None, total_encoder_layers: int) -> str:
    """PEFT's target regex: the demo adapters' decoder modules, plus for all_layers the
    cross-attention k/v and the last `encoder_layers` encoder layers."""
    if kind == "decoder":
        return DECODER_LORA_TARGETS
    first = total_encoder_layers - min(encoder_layers or total_encoder_layers, total_encoder_layers)
    layers = "|".join(str(i) for i in range(first, total_encoder_layers))
    encoder = rf"model\.encoder\.layers\.({layers})\.{ENCODER_MODULES}"
    return f"({DECODER_LORA_TARGETS})|({encoder})|({CROSS_KV_LORA_TARGETS})"


def first_lora_encoder_layer(targets: str, total_encoder_layers: int) -> int:
    """Index of the lowest encoder layer the targets touch (total: none)."""
    pattern = re.compile(targets)
    for index in range(total_encoder_layers):
        if pattern.fullmatch(f"model.encoder.layers.{index}.fc1"):
            return index
    return total_encoder_layers


def decoder_ids(prompt_ids: list[int], text_ids: list[int], end_id: int) -> tuple[list, list]:
    """Teacher forcing: inputs = prompt + text, labels = the next token, prompt positions
    ignored (-100), so the loss covers the text and <|endoftext|>."""
    sequence = [*prompt_ids, *text_ids, end_id]
    labels = [-100] * (len(prompt_ids) - 1) + sequence[len(prompt_ids) :]
    return sequence[:-1], labels


def _encoder_stem(encoder, features, frozen_layers: int):
    """Whisper's encoder up to (not including) layer `frozen_layers`; all of it, with the final
    layer norm, when frozen_layers is the layer count. Mirrors WhisperEncoder.forward."""
    import torch

    hidden = torch.nn.functional.gelu(encoder.conv1(features))
    hidden = torch.nn.functional.gelu(encoder.conv2(hidden)).permute(0, 2, 1)
    hidden = hidden + encoder.embed_positions.weight[: hidden.shape[1]]
    for layer in encoder.layers[:frozen_layers]:
        hidden = layer(hidden, None)
    if frozen_layers == len(encoder.layers):
        hidden = encoder.layer_norm(hidden)
    return hidden


def _encoder_top(encoder, hidden, first_layer: int):
    for layer in encoder.layers[first_layer:]:
        hidden = layer(hidden, None)
    return encoder.layer_norm(hidden)


def train_adapter(
    base_dir: Path,
    adapter_dir: Path,
    utterances: Sequence[Utterance],
    speech_dir: Path,
    settings: TrainSettings | None = None,
    *,
    progress: bool = True,
) -> TrainReport:
    """Train one adapter and write it to adapter_dir (atomically: staged beside it, renamed)."""
    import torch

    settings = settings or TrainSettings()
    threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        return _train(base_dir, adapter_dir, utterances, speech_dir, settings, progress)
    finally:
        torch.set_num_threads(threads)


def _train(base_dir, adapter_dir, utterances, speech_dir, settings, progress) -> TrainReport:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import WhisperForConditionalGeneration

    started = time.monotonic()
    torch.manual_seed(settings.seed)
    base_dir = Path(base_dir).absolute()
    model = WhisperForConditionalGeneration.from_pretrained(base_dir, dtype=torch.float32)
    targets = lora_targets(settings.kind, settings.encoder_layers, model.config.encoder_layers)
    first_trained = first_lora_encoder_layer(targets, model.config.encoder_layers)

    clips = [(load_16k(synthesise(u, speech_dir)), u.text) for u in utterances]
    windows = pack_windows(clips, settings.window_seconds)
    examples = _encode_windows(model, base_dir, windows, first_trained, progress)
    lora = LoraConfig(
        r=settings.rank, lora_alpha=settings.alpha, lora_dropout=0.0, target_modules=targets
    )
    peft_model = get_peft_model(model, lora)
    peft_model.eval()  # dropout is 0 anyway; eval keeps the forward pass exactly the served one
    losses = _fit(peft_model.base_model.model, examples, first_trained, settings, progress)
    save_adapter(peft_model, Path(adapter_dir))
    epoch = len(examples)
    return TrainReport(
        adapter_dir=Path(adapter_dir),
        clips=len(clips),
        windows=len(windows),
        steps=len(losses),
        seconds=time.monotonic() - started,
        first_loss=float(np.mean(losses[:epoch])),
        last_loss=float(np.mean(losses[-epoch:])),
    )


def _encode_windows(model, base_dir: Path, windows: list[Window], first_trained: int, progress):
    """Per window: the frozen part of the encoder's output, decoder inputs and labels."""
    import torch
    from transformers import AutoTokenizer, WhisperFeatureExtractor

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    extractor = WhisperFeatureExtractor.from_pretrained(base_dir)
    prompt_ids = tokenizer.convert_tokens_to_ids(list(PROMPT_TOKENS))
    examples = []
    with torch.no_grad():
        for window in tqdm(windows, desc="encode windows", disable=not progress):
            features = padded_features(extractor, window.samples)  # as served
            text_ids = tokenizer.encode(" " + window.text, add_special_tokens=False)
            inputs, labels = decoder_ids(prompt_ids, text_ids, model.config.eos_token_id)
            stem = _encoder_stem(model.model.encoder, features, first_trained)
            examples.append((stem, torch.tensor([inputs]), torch.tensor([labels])))
    return examples


def _fit(whisper, examples, first_trained: int, settings: TrainSettings, progress) -> list[float]:
    """AdamW over the LoRA weights, one window per step, shuffled per epoch; linear warm-up
    over 10 steps, then linear decay to zero. Returns the loss of every step."""
    import torch
    from transformers.modeling_outputs import BaseModelOutput

    encoder = whisper.model.encoder
    whole_encoder_frozen = first_trained == len(encoder.layers)
    optimizer = torch.optim.AdamW(
        [p for p in whisper.parameters() if p.requires_grad], lr=settings.learning_rate
    )
    steps = settings.epochs * len(examples)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 10) * (1 - step / steps)
    )
    order = np.random.default_rng(settings.seed)
    losses: list[float] = []
    bar = tqdm(total=steps, desc=f"train {settings.kind}", unit="step", disable=not progress)
    for _ in range(settings.epochs):
        for index in order.permutation(len(examples)):
            stem, inputs, labels = examples[index]
            hidden = stem if whole_encoder_frozen else _encoder_top(encoder, stem, first_trained)
            output = whisper(
                encoder_outputs=BaseModelOutput(last_hidden_state=hidden),
                decoder_input_ids=inputs,
                labels=labels,
            )
            output.loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(output.loss.item())
            bar.set_postfix(loss=f"{np.mean(losses[-len(examples) :]):.3f}")
            bar.update()
    bar.close()
    return losses


def save_adapter(peft_model, adapter_dir: Path) -> None:
    """adapter_config.json + adapter_model.safetensors, staged as a dot-folder (skipped by the
    server's scans) and renamed into place; an existing adapter's files are replaced one by one
    (rename over them), which the fleet serves as a new version."""
    adapter_dir = adapter_dir.absolute()
    adapter_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = adapter_dir.with_name(f".{adapter_dir.name}.incoming")
    shutil.rmtree(staging, ignore_errors=True)
    peft_model.save_pretrained(staging, safe_serialization=True)
    for path in staging.iterdir():
        path.chmod(0o644)  # the safetensors writer leaves 0600; the server may run as another user
    if not adapter_dir.exists():
        staging.rename(adapter_dir)
        return
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        os.replace(staging / name, adapter_dir / name)
    shutil.rmtree(staging)
