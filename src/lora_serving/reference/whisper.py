"""Whisper reference: the adapter merged into the base weights, then plain greedy decoding.

The engine applies LoRA as a separate low-rank path per request; merging with PEFT is the
independent ground truth tests compare it with. Greedy takes the argmax of the raw logits, with
none of generate()'s logits processors (suppress_tokens etc.), as vLLM does with temperature 0.
"""

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

SAMPLE_RATE = 16_000


@lru_cache(maxsize=4)
def _load_model(base_dir: str, adapter_dir: str | None):
    """float32 model with the adapter merged in; cached because tests call this many times."""
    from peft import PeftModel
    from transformers import WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration.from_pretrained(base_dir, dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    return model.eval()


@lru_cache(maxsize=2)
def _load_feature_extractor(base_dir: str):
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor.from_pretrained(base_dir)


def reference_generate(
    base_dir: Path,
    adapter_dir: Path | None,
    audio_16k: np.ndarray,
    decoder_prompt_ids: list[int],
    max_tokens: int,
) -> tuple[list[int], list[float]]:
    """Greedy tokens after decoder_prompt_ids and the log-probability of each.

    Stops after <|endoftext|> (included, as vLLM includes it) or after max_tokens tokens.
    """
    base_key = str(Path(base_dir).absolute())
    adapter_key = None if adapter_dir is None else str(Path(adapter_dir).absolute())
    model = _load_model(base_key, adapter_key)
    features = _load_feature_extractor(base_key)(
        np.asarray(audio_16k, dtype=np.float32), sampling_rate=SAMPLE_RATE, return_tensors="pt"
    ).input_features
    end_of_text = model.config.eos_token_id

    token_ids: list[int] = []
    logprobs: list[float] = []
    with torch.inference_mode():
        encoder_outputs = model.get_encoder()(features)
        next_input = torch.tensor([decoder_prompt_ids])
        past_key_values = None
        for _ in range(max_tokens):
            output = model(
                encoder_outputs=encoder_outputs,
                decoder_input_ids=next_input,
                past_key_values=past_key_values,
                use_cache=True,
            )
            step_logprobs = torch.log_softmax(output.logits[0, -1].float(), dim=-1)
            token = int(step_logprobs.argmax())
            token_ids.append(token)
            logprobs.append(float(step_logprobs[token]))
            if token == end_of_text:
                break
            past_key_values = output.past_key_values
            next_input = torch.tensor([[token]])
    return token_ids, logprobs
