"""Whisper's languages: codes, names and the ones a served model has.

The tables are openai-whisper's (`whisper/tokenizer.py`, release 20250625: LANGUAGES in its token
order, TO_LANGUAGE_CODE's aliases), written out here: openai-whisper itself is not installed in the
served environment. Which languages a model takes comes from the model itself (its
generation_config's `lang_to_id`, else its tokenizer's language tokens): 99 for whisper-base,
100 (with `yue`) for large-v3. A request names one by code or by name, as openai-whisper and
faster-whisper accept: "de", "german", "cantonese" -> "yue", "javanese" -> "jw", "castilian" ->
"es".
"""

import json
from pathlib import Path

from lora_serving.errors import ConfigError, InvalidRequest

# code -> name, in the order of Whisper's language tokens (<|en|> is the first).
LANGUAGES = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian",
    "ko": "korean", "fr": "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish",
    "pl": "polish", "ca": "catalan", "nl": "dutch", "ar": "arabic", "sv": "swedish",
    "it": "italian", "id": "indonesian", "hi": "hindi", "fi": "finnish", "vi": "vietnamese",
    "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay", "cs": "czech",
    "ro": "romanian", "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian",
    "th": "thai", "ur": "urdu", "hr": "croatian", "bg": "bulgarian", "lt": "lithuanian",
    "la": "latin", "mi": "maori", "ml": "malayalam", "cy": "welsh", "sk": "slovak", "te": "telugu",
    "fa": "persian", "lv": "latvian", "bn": "bengali", "sr": "serbian", "az": "azerbaijani",
    "sl": "slovenian", "kn": "kannada", "et": "estonian", "mk": "macedonian", "br": "breton",
    "eu": "basque", "is": "icelandic", "hy": "armenian", "ne": "nepali", "mn": "mongolian",
    "bs": "bosnian", "kk": "kazakh", "sq": "albanian", "sw": "swahili", "gl": "galician",
    "mr": "marathi", "pa": "punjabi", "si": "sinhala", "km": "khmer", "sn": "shona",
    "yo": "yoruba", "so": "somali", "af": "afrikaans", "oc": "occitan", "ka": "georgian",
    "be": "belarusian", "tg": "tajik", "sd": "sindhi", "gu": "gujarati", "am": "amharic",
    "yi": "yiddish", "lo": "lao", "uz": "uzbek", "fo": "faroese", "ht": "haitian creole",
    "ps": "pashto", "tk": "turkmen", "nn": "nynorsk", "mt": "maltese", "sa": "sanskrit",
    "lb": "luxembourgish", "my": "myanmar", "bo": "tibetan", "tl": "tagalog", "mg": "malagasy",
    "as": "assamese", "tt": "tatar", "haw": "hawaiian", "ln": "lingala", "ha": "hausa",
    "ba": "bashkir", "jw": "javanese", "su": "sundanese", "yue": "cantonese",
}  # fmt: skip

# name -> code: every name above, and openai-whisper's aliases.
TO_LANGUAGE_CODE = {
    **{name: code for code, name in LANGUAGES.items()},
    "burmese": "my",
    "valencian": "ca",
    "flemish": "nl",
    "haitian": "ht",
    "letzeburgesch": "lb",
    "pushto": "ps",
    "panjabi": "pa",
    "moldavian": "ro",
    "moldovan": "ro",
    "sinhalese": "si",
    "castilian": "es",
    "mandarin": "zh",
}


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
