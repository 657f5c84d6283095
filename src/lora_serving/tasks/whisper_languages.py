"""Whisper's languages: codes, names and the ones a served model has.

The tables are openai-whisper's (lora_media.whisper_languages, shared with the OpenAI front).
Which languages a model takes comes from the model itself (its
generation_config's `lang_to_id`, else its tokenizer's language tokens): 99 for whisper-base,
100 (with `yue`) for large-v3. A request names one by code or by name, as openai-whisper and
faster-whisper accept: "de", "german", "cantonese" -> "yue", "javanese" -> "jw", "castilian" ->
"es".
"""

import json
from pathlib import Path

from lora_media.whisper_languages import LANGUAGES, TO_LANGUAGE_CODE
from lora_serving.errors import ConfigError, InvalidRequest

__all__ = ["LANGUAGES", "TO_LANGUAGE_CODE", "english_only", "model_languages", "resolve"]

# openai-whisper's rule (`Whisper.is_multilingual`): English-only models (tiny.en ... medium.en)
# have the gpt2 vocabulary's 51,864 rows; multilingual ones 51,865, large-v3 on 51,866.
MULTILINGUAL_VOCAB_SIZE = 51_865


def english_only(tokenizer) -> bool:
    """An English-only (.en) Whisper: its vocabulary has language tokens it was never trained
    with, and openai-whisper and transformers put none in its prompt."""
    return len(tokenizer) < MULTILINGUAL_VOCAB_SIZE


def resolve_english_only(requested: str) -> str:
    """A request's language for an English-only model: English by code or name, else refused."""
    key = requested.strip().lower()
    if key == "en" or TO_LANGUAGE_CODE.get(key) == "en":
        return "en"
    raise InvalidRequest(
        f"language '{requested.strip()}' is not available: this model is English-only (it "
        "transcribes English only and cannot translate); send 'en' or leave language out"
    )


def model_languages(model_dir: Path, tokenizer) -> dict[str, int]:
    """code -> <|code|> token id for every language the model has, in token order.

    From generation_config.json's `lang_to_id` (as transformers' generate() reads it), checked
    against the tokenizer; without one, the tokenizer's <|code|> tokens of openai-whisper's codes.
    """
    vocab = tokenizer.get_vocab()
    path = Path(model_dir) / "generation_config.json"
    lang_to_id = json.loads(path.read_text()).get("lang_to_id") if path.is_file() else None
    if not lang_to_id:
        found = {code: vocab[f"<|{code}|>"] for code in LANGUAGES if f"<|{code}|>" in vocab}
        return dict(sorted(found.items(), key=lambda item: item[1]))
    wrong = [token for token, i in lang_to_id.items() if vocab.get(token) != i]
    if wrong:
        raise ConfigError(
            str(path),
            [f"lang_to_id disagrees with the tokenizer for {', '.join(wrong[:8])}"],
        )
    return {token.strip("<|>"): i for token, i in sorted(lang_to_id.items(), key=lambda x: x[1])}


def resolve(requested: str, available: dict[str, int]) -> str:
    """A requested language (code or name, any case) -> the model's code for it."""
    key = requested.strip().lower()
    code = key if key in available else TO_LANGUAGE_CODE.get(key)
    if code in available:
        return code
    raise InvalidRequest(
        f"unknown language '{requested.strip()}'; this model knows {len(available)}: "
        f"{', '.join(sorted(available))} (or their names, e.g. "
        f"{', '.join(LANGUAGES[c] for c in list(available)[:3] if c in LANGUAGES)}); "
        "or leave it out to detect"
    )
