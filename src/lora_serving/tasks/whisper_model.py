"""What a Whisper request needs to know of the served model, read once at load: its tokenizer,
special tokens, languages, limits and alignment heads; and the engine prompt form."""

import json
from pathlib import Path
from typing import Any

import numpy as np

from lora_serving import audio
from lora_serving.settings import EngineSettings
from lora_serving.tasks import whisper_languages, whisper_vad, whisper_words
from lora_serving.vllm_plugin import whisper_decoder_prompt

TASKS = ("transcribe", "translate")


class WhisperModel:
    def __init__(self, settings: EngineSettings, tokenizer):
        self.tokenizer = tokenizer
        model_dir = Path(settings.engine_args["model"])
        self.max_model_len = int(settings.engine_args.get("max_model_len") or 448)
        self.english_only = whisper_languages.english_only(tokenizer)
        self.languages = (
            {"en": tokenizer.convert_tokens_to_ids("<|en|>")}
            if self.english_only
            else whisper_languages.model_languages(settings.engine_args["model"], tokenizer)
        )
        self.no_space_languages = _no_space_languages()
        self.special = {
            name: tokenizer.convert_tokens_to_ids(f"<|{name}|>")
            for name in ("startoftranscript", "startofprev", "notimestamps", *TASKS)
        }
        # transformers' no-speech token: the one before <|notimestamps|> (<|nospeech|>, named
        # <|nocaptions|> in the first multilingual vocabularies).
        self.special["nospeech"] = self.special["notimestamps"] - 1
        self.max_logprobs = int(settings.engine_args.get("max_logprobs", -1))
        if self.max_logprobs < 0:
            self.max_logprobs = len(tokenizer)
        self.timestamp_rules = {
            "timestamp_begin": tokenizer.convert_tokens_to_ids("<|0.00|>"),
            "eot": tokenizer.eos_token_id,
        }
        self.alignment_heads = _alignment_heads(model_dir)
        self.eager = bool(settings.engine_args.get("enforce_eager"))
        self.speech_detector = whisper_vad.SpeechDetector()  # vad_filter: one per model instance
        self._token_text: whisper_words.TokenText | None = None
        self._decoder_prompt_kept: bool | None = None

    @property
    def token_text(self) -> whisper_words.TokenText:
        """Token texts for word splitting, built on the first word request."""
        if self._token_text is None:
            self._token_text = whisper_words.TokenText(self.tokenizer)
        return self._token_text

    def prompt_kept(self) -> bool:
        """Whether our plugin keeps decoder prompts as given (asked once: it does not change
        once the engine runs)."""
        if self._decoder_prompt_kept is None:
            self._decoder_prompt_kept = whisper_decoder_prompt.applied()
        return self._decoder_prompt_kept


def whisper_prompt(
    samples: np.ndarray, decoder_ids: list[int], name: str | None = None
) -> dict[str, Any]:
    """vLLM's encoder-decoder prompt for one window. `name` identifies the window's audio to
    vLLM (multi_modal_uuids): requests of one window share it, so the encoder memo
    (vllm_plugin/whisper_encoder_memo) encodes it once."""
    encoder_prompt: dict[str, Any] = {
        "prompt": "",
        "multi_modal_data": {"audio": (samples, audio.WHISPER_SAMPLE_RATE)},
    }
    if name is not None:
        encoder_prompt["multi_modal_uuids"] = {"audio": [name]}
    return {
        "encoder_prompt": encoder_prompt,
        "decoder_prompt": {"prompt_token_ids": list(decoder_ids)},
    }


def _alignment_heads(model_dir: Path) -> list[list[int]]:
    """generation_config `alignment_heads`: [[decoder layer, head], ...] ([] without one)."""
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return []
    heads = json.loads(path.read_text()).get("alignment_heads") or []
    return [[int(layer), int(head)] for layer, head in heads]


def _no_space_languages() -> set[str]:
    """Languages whose windows join without a space: vLLM's list (Chinese, Japanese) and
    Cantonese, which Whisper writes in Chinese characters too."""
    from vllm.model_executor.models.whisper import WhisperForConditionalGeneration

    return set(WhisperForConditionalGeneration.no_space_languages) | {"yue"}
