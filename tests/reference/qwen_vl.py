"""Greedy Qwen-VL generation in Hugging Face transformers with LoRA merged into the weights.

The ground truth that vLLM's dynamic LoRA (language model, vision tower and merger) must match:
float32, adapter merged by PEFT, and a plain argmax loop that recomputes the whole sequence every
step, so nothing depends on KV-cache or M-RoPE delta bookkeeping. It imports nothing of the
product it judges (lora_serving, lora_tools).
"""

from functools import lru_cache
from pathlib import Path
from typing import Literal

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from PIL.Image import Image
from transformers import AutoModelForImageTextToText, AutoProcessor, GenerationConfig

MergeScope = Literal["all", "language_only"]


@lru_cache(maxsize=4)
def _processor(base_dir: Path):
    return AutoProcessor.from_pretrained(base_dir)


@lru_cache(maxsize=4)
def _stop_token_ids(base_dir: Path) -> frozenset[int]:
    eos = GenerationConfig.from_pretrained(base_dir).eos_token_id
    return frozenset(eos if isinstance(eos, list) else [eos])


def _merge_language_model_only(peft_model: PeftModel) -> torch.nn.Module:
    """Merge the LoRA layers under the language model and drop the rest (tower and merger)."""
    for name, module in peft_model.named_modules():
        if isinstance(module, LoraLayer) and ".language_model." in name:
            module.merge()
    return peft_model.unload()


@lru_cache(maxsize=8)
def _merged_model(base_dir: Path, adapter_dir: Path | None, merge: MergeScope) -> torch.nn.Module:
    """Base model with the adapter merged; one load per (model, adapter, scope) per process."""
    model = AutoModelForImageTextToText.from_pretrained(base_dir, dtype=torch.float32)
    if adapter_dir is not None:
        peft_model = PeftModel.from_pretrained(model, adapter_dir)
        if merge == "all":
            model = peft_model.merge_and_unload()
        else:
            model = _merge_language_model_only(peft_model)
    return model.eval()


def video_metadata(num_frames: int, fps: float) -> dict:
    """transformers' video metadata (its VideoMetadata fields) for frames already sampled at
    `fps`: the processor then spaces the frames in time (M-RoPE) without sampling again."""
    return {
        "total_num_frames": num_frames,
        "fps": fps,
        "duration": num_frames / fps,
        "frames_indices": list(range(num_frames)),
    }


def _append_column(batch: torch.Tensor, value: int) -> torch.Tensor:
    return torch.cat([batch, batch.new_full((1, 1), value)], dim=1)


def streamed_text(tokenizer, tokens: list[int]) -> str:
    """The text vLLM sends for these tokens: a token whose bytes end inside a character is
    held back whole until later tokens complete it, so at the end of generation the trailing
    tokens that leave an incomplete character are not in the text (decode() would show them,
    with U+FFFD for the incomplete bytes)."""
    end = len(tokens)
    while end and tokenizer.decode(tokens[:end], skip_special_tokens=True).endswith("\ufffd"):
        end -= 1
    return tokenizer.decode(tokens[:end], skip_special_tokens=True)


@torch.inference_mode()
def reference_generate(
    base_dir: Path,
    adapter_dir: Path | None,
    prompt: str,
    images: list[Image],
    max_tokens: int,
    merge: MergeScope = "all",
    videos: list[list[Image]] | None = None,
    video_fps: float = 2.0,
) -> tuple[list[int], list[float]]:
    """Greedy token ids and their logprobs for a fully templated prompt with media placeholders.

    Generation stops after an EOS token from generation_config (<|im_end|>, <|endoftext|>), which
    is included in the output as vLLM includes it, or after max_tokens. Each video is a list of
    frames already sampled at video_fps (give vLLM the same fps).
    """
    base_dir = Path(base_dir).resolve()
    adapter_dir = Path(adapter_dir).resolve() if adapter_dir is not None else None
    model = _merged_model(base_dir, adapter_dir, merge)
    video_kwargs = {}
    if videos:
        video_kwargs = {
            "videos": videos,
            "video_metadata": [video_metadata(len(frames), video_fps) for frames in videos],
            "do_sample_frames": False,  # already sampled (Qwen3-VL's processor would resample)
        }
    inputs = _processor(base_dir)(
        text=[prompt], images=images or None, return_tensors="pt", **video_kwargs
    )
    input_ids = inputs.pop("input_ids")
    inputs.pop("attention_mask", None)  # one unpadded sequence: all ones
    stop_token_ids = _stop_token_ids(base_dir)

    token_ids: list[int] = []
    logprobs: list[float] = []
    for _ in range(max_tokens):
        logits = model(input_ids=input_ids, use_cache=False, logits_to_keep=1, **inputs).logits
        last_logits = logits[0, -1].float()
        token_id = int(torch.argmax(last_logits))
        token_ids.append(token_id)
        logprobs.append(float(torch.log_softmax(last_logits, dim=-1)[token_id]))
        if token_id in stop_token_ids:
            break
        input_ids = _append_column(input_ids, token_id)
        if "mm_token_type_ids" in inputs:  # M-RoPE marks generated tokens as text (0)
            inputs["mm_token_type_ids"] = _append_column(inputs["mm_token_type_ids"], 0)
    return token_ids, logprobs
