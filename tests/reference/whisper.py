"""Whisper reference: the adapter merged into the base weights, then transformers' decoding.

The engine applies LoRA as a separate low-rank path per request; merging with PEFT is the
independent ground truth tests compare it with. `reference_generate` is transformers' own
`generate()` with the model's generation_config (suppress_tokens and begin_suppress_tokens on,
timestamp rules when the prompt asks for timestamps): what whisper_lora serves by default.
`greedy_without_rules` takes the argmax of the raw logits, as bare vLLM does at temperature 0;
tests of the engine alone (no served decoding rules) compare with it.
`reference_ctranslate2_beam` is faster-whisper's beam search (CTranslate2's) on the merged weights.
It imports nothing of the product it judges (lora_serving, lora_tools): its window padding is
openai-whisper's and its beam search CTranslate2's, each written here from those sources.
"""

import copy
import math
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
    """The log-mel window of one 16 kHz recording of at most 30 s, as openai-whisper's
    `transcribe()` builds it: the log-mel spectrogram of the audio followed by 30 s of silence
    (`log_mel_spectrogram(audio, padding=N_SAMPLES)`), its first `len(audio) // hop_length`
    frames kept (`content_frames`), then zero frames up to 30 s (`pad_or_trim`). The log-mel
    itself is the model's feature extractor (transformers' port of openai-whisper's), so the
    frames are the ones the model was trained on.

    Written here, not borrowed from the served padding (vllm_plugin.whisper_feature_padding sets
    transformers' frames after the audio to zero): tests/unit/test_reference_features.py shows
    both give the same window for every recording shorter than 30 s (a full 30 s window differs
    in its last frame: there the served one reflects the audio, openai-whisper's is silence)."""
    extractor = _load_feature_extractor(str(Path(base_dir).absolute()))
    samples = np.asarray(audio_16k, dtype=np.float32)
    window_samples = extractor.n_samples  # 30 s
    if len(samples) > window_samples:
        raise ValueError(f"one window of at most 30 s, got {len(samples) / SAMPLE_RATE:.2f} s")
    with_silence = np.concatenate([samples, np.zeros(window_samples, dtype=np.float32)])
    mel = extractor(
        with_silence,
        sampling_rate=SAMPLE_RATE,
        padding="longest",  # no cut at 30 s: the whole recording and its silence
        truncation=False,
        return_tensors="pt",
    ).input_features[0]
    content_frames = len(samples) // extractor.hop_length
    window = torch.zeros(mel.shape[0], extractor.nb_max_frames, dtype=mel.dtype)
    window[:, :content_frames] = mel[:, :content_frames]
    return window[None]


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
    length_penalty: float = 1.0,
    patience: float = 1.0,
) -> list[int]:
    """faster-whisper's beam search on the merged weights in float32: CTranslate2's
    `BeamSearch::search` (src/decoding.cc), step for step, over transformers' logits. For
    served searches with adapters, whose peer (faster-whisper) cannot load a LoRA adapter.

    Each step's log-probabilities are log_softmax of the logits after the generation_config's
    suppression (begin_suppress_tokens on the first step only), renormalised, as CTranslate2's
    Whisper applies its suppression before LogSoftMax. Plain transcripts (the prompt ends in
    <|notimestamps|>). Returns the best hypothesis' tokens, <|endoftext|> included when it
    ended with it (as served)."""
    model, features = _model_and_features(base_dir, adapter_dir, audio_16k)
    config = model.generation_config
    end_of_text = model.config.eos_token_id
    everywhere = list(config.suppress_tokens or ())
    at_begin = list(config.begin_suppress_tokens or ())
    with torch.inference_mode():
        encoded = model.model.encoder(features).last_hidden_state

    def step_logprobs(tokens: list[int]) -> torch.Tensor:
        """[vocab] log-probabilities of the next token after the prompt and `tokens`."""
        with torch.inference_mode():
            ids = torch.tensor([decoder_prompt_ids + tokens])
            logits = model(encoder_outputs=(encoded,), decoder_input_ids=ids).logits[0, -1]
            logits = logits.float().clone()
            logits[everywhere + ([] if tokens else at_begin)] = -torch.inf
            return torch.log_softmax(logits, dim=-1)

    hypotheses = ctranslate2_beam_search(
        step_logprobs,
        beam_size=beams,
        max_length=max_tokens,
        end_id=end_of_text,
        length_penalty=length_penalty,
        patience=patience,
    )
    return hypotheses[0]


def ctranslate2_beam_search(
    step_logprobs,
    *,
    beam_size: int,
    max_length: int,
    end_id: int,
    length_penalty: float = 1.0,
    patience: float = 1.0,
) -> list[list[int]]:
    """CTranslate2's beam search for one sequence (decoding.cc, `BeamSearch::search`, one
    hypothesis returned as faster-whisper asks; no prefix, no coverage penalty), best first.

    `step_logprobs(tokens)` gives the float32 log-probabilities of the next token after
    `tokens`. Rules, as CTranslate2 has them:
    - the first step expands the one empty beam; every step takes the top 2 * beam_size of
      (beam score + log-probability) over all beams and tokens (float32 sums);
    - of the first beam_size candidates, one ending in end_id, or any on the last step, is a
      finished hypothesis with its sum as score; its beam slot goes to the next candidate from
      beam_size on that does not end in end_id;
    - the search ends on the last step; or, with length_penalty 0, once the top candidate has
      finished at some step and a hypothesis exists; otherwise once
      round(beam_size * patience) hypotheses are finished;
    - hypotheses are ranked by score / length ** length_penalty, the length without end_id
      (`include_eos_in_hypotheses` false), best first.
    Hypotheses are returned with their end_id (served transcripts keep it)."""
    num_candidates = 2 * beam_size
    max_candidates = round(beam_size * patience)
    early_exit = length_penalty == 0
    beams: list[list[int]] = [[]]
    scores = torch.zeros(1, dtype=torch.float32)
    finished: list[tuple[float, list[int]]] = []  # (score, tokens)
    top_beam_finished = False
    for step in range(max_length):
        last_step = step + 1 == max_length
        totals = torch.stack([scores[b] + step_logprobs(beams[b]) for b in range(len(beams))])
        vocab = totals.shape[1]
        top_scores, top_ids = torch.topk(totals.reshape(-1), num_candidates)
        candidates = [
            (float(score), beams[int(flat) // vocab] + [int(flat) % vocab])
            for score, flat in zip(top_scores.tolist(), top_ids.tolist(), strict=True)
        ]
        next_beams, next_scores = [], []
        secondary = beam_size
        for k in range(beam_size):
            chosen = k
            score, tokens = candidates[k]
            if tokens[-1] == end_id or last_step:
                top_beam_finished |= k == 0
                finished.append((score, tokens))
                for j in range(secondary, num_candidates):
                    if candidates[j][1][-1] != end_id:
                        chosen, secondary = j, j + 1
                        break
            next_beams.append(candidates[chosen][1])
            next_scores.append(candidates[chosen][0])
        if last_step:
            break
        if early_exit and top_beam_finished and finished:
            break
        if not early_exit and len(finished) >= max_candidates:
            break
        beams = next_beams
        scores = torch.tensor(next_scores, dtype=torch.float32)

    def normalised(item: tuple[float, list[int]]) -> float:
        score, tokens = item
        length = len(tokens) - (tokens[-1] == end_id)
        return score / length**length_penalty if length else -math.inf

    return [tokens for _, tokens in sorted(finished, key=normalised, reverse=True)]
