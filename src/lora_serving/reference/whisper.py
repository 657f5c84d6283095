"""Whisper reference: the adapter merged into the base weights, then transformers' decoding.

The engine applies LoRA as a separate low-rank path per request; merging with PEFT is the
independent ground truth tests compare it with. `reference_generate` is transformers' own
`generate()` with the model's generation_config (suppress_tokens and begin_suppress_tokens on,
timestamp rules when the prompt asks for timestamps): what whisper_lora serves by default.
`greedy_without_rules` takes the argmax of the raw logits, as bare vLLM does at temperature 0;
tests of the engine alone (no served decoding rules) compare with it.
"""

import copy
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
    *,
    suppress_tokens: list[int] | None = None,
    suppress_blank: bool = True,
    num_beams: int = 1,
) -> tuple[list[int], list[float]]:
    """transformers' `generate()` after decoder_prompt_ids: (tokens, log-probability of each
    after the logits processors). Stops after <|endoftext|> (included, as vLLM includes it) or
    after max_tokens tokens.

    suppress_tokens None: the generation_config's list; [] none. Timestamp rules apply when the
    prompt lacks <|notimestamps|> (generate's return_timestamps). num_beams > 1: transformers'
    beam search (its default length penalty 1.0 and early stopping); no log-probabilities then.
    """
    model, features = _model_and_features(base_dir, adapter_dir, audio_16k)
    config = copy.deepcopy(model.generation_config)
    if suppress_tokens is not None:
        config.suppress_tokens = list(suppress_tokens) or None
    if not suppress_blank:
        config.begin_suppress_tokens = None
    config.max_length = None  # max_new_tokens decides
    timestamps = config.no_timestamps_token_id not in decoder_prompt_ids
    # The prompt's own language and task, so generate() does not detect a language first
    # (English-only models have neither table).
    named = {
        "language": _named(getattr(config, "lang_to_id", None), decoder_prompt_ids),
        "task": _named(getattr(config, "task_to_id", None), decoder_prompt_ids),
    }
    with torch.inference_mode():
        output = model.generate(
            features,
            generation_config=config,
            decoder_input_ids=torch.tensor([decoder_prompt_ids]),
            max_new_tokens=max_tokens,
            return_timestamps=timestamps,
            return_dict_in_generate=True,
            output_scores=True,
            num_beams=num_beams,
            **{key: value for key, value in named.items() if value is not None},
        )
    if isinstance(output, dict) and "segments" in output:
        # With timestamps transformers returns {"sequences": the text between timestamps,
        # "segments": ...}; the first window's own generate() output is in its first segment.
        output = output["segments"][0][0]["result"]
        sequences, scores = output["sequences"].reshape(1, -1), output["scores"]
    else:
        sequences, scores = output.sequences, output.scores
    tokens = sequences[0, len(decoder_prompt_ids) :].tolist()
    if num_beams > 1:
        end_of_text = model.config.eos_token_id
        return (tokens[: tokens.index(end_of_text) + 1] if end_of_text in tokens else tokens), []
    logprobs = [
        float(torch.log_softmax(step.reshape(-1, step.shape[-1])[0].float(), dim=-1)[token])
        for step, token in zip(scores, tokens, strict=False)
    ]
    end_of_text = model.config.eos_token_id
    if end_of_text in tokens:  # nothing after the first end of text counts
        tokens = tokens[: tokens.index(end_of_text) + 1]
    return tokens, logprobs[: len(tokens)]


def _named(name_to_id: dict | None, ids: list[int]) -> str | None:
    """The name (e.g. "<|en|>" -> "en", "transcribe") of the first id of `ids` in the table."""
    by_id = {token: name for name, token in (name_to_id or {}).items()}
    found = next((by_id[token] for token in ids if token in by_id), None)
    return None if found is None else found.strip("<|>")


def _model_and_features(base_dir: Path, adapter_dir: Path | None, audio_16k: np.ndarray):
    base_key = str(Path(base_dir).absolute())
    adapter_key = None if adapter_dir is None else str(Path(adapter_dir).absolute())
    model = _load_model(base_key, adapter_key)
    return model, reference_features(base_key, audio_16k)


def reference_features(base_dir, audio_16k: np.ndarray):
    """The log-mel window whisper_lora serves (zero after the audio, as openai-whisper pads a
    short window: vllm_plugin.whisper_feature_padding)."""
    from lora_serving.vllm_plugin.whisper_feature_padding import padded_features

    extractor = _load_feature_extractor(str(Path(base_dir).absolute()))
    return padded_features(extractor, np.asarray(audio_16k, dtype=np.float32))


def greedy_without_rules(
    base_dir: Path,
    adapter_dir: Path | None,
    audio_16k: np.ndarray,
    decoder_prompt_ids: list[int],
    max_tokens: int,
) -> tuple[list[int], list[float]]:
    """Greedy tokens after decoder_prompt_ids and the log-probability of each.

    Stops after <|endoftext|> (included, as vLLM includes it) or after max_tokens tokens.
    """
    model, features = _model_and_features(base_dir, adapter_dir, audio_16k)
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


def reference_ctranslate2_beam(
    base_dir: Path,
    adapter_dir: Path | None,
    audio_16k: np.ndarray,
    decoder_prompt_ids: list[int],
    max_tokens: int,
    *,
    beams: int = 5,
) -> list[int]:
    """faster-whisper's beam search (CTranslate2's rule, whisper_beam) on the merged weights in
    float32: each step's log-probabilities are log_softmax of transformers' logits after the
    generation_config's suppression, renormalised, as CTranslate2 computes them. Plain
    transcripts (the prompt ends in <|notimestamps|>). For served searches with adapters, whose
    peer (faster-whisper) cannot load a LoRA adapter."""
    import asyncio

    from lora_serving.tasks.whisper_beam import FASTER_WHISPER, BeamOptions, beam_search

    model, features = _model_and_features(base_dir, adapter_dir, audio_16k)
    config = model.generation_config
    everywhere = list(config.suppress_tokens or ())
    at_begin = list(config.begin_suppress_tokens or ())
    with torch.inference_mode():
        encoded = model.model.encoder(features).last_hidden_state

    async def score_next(tokens: list[int]) -> dict[int, float]:
        with torch.inference_mode():
            ids = torch.tensor([decoder_prompt_ids + tokens])
            logits = model(encoder_outputs=(encoded,), decoder_input_ids=ids).logits[0, -1]
            logits = logits.float().clone()
            logits[everywhere + ([] if tokens else at_begin)] = -torch.inf
            top = torch.topk(torch.log_softmax(logits, dim=-1), 2 * beams)
        return dict(zip(top.indices.tolist(), top.values.tolist(), strict=True))

    result = asyncio.run(
        beam_search(
            score_next,
            options=BeamOptions(beams, rule=FASTER_WHISPER),
            max_tokens=max_tokens,
            end_of_text=model.config.eos_token_id,
        )
    )
    return result.tokens
