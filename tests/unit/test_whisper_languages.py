"""Every language the served Whisper has, by code or by openai-whisper's names."""

import ast
import subprocess
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from lora_serving.errors import ConfigError, InvalidRequest
from lora_serving.tasks import whisper_languages
from lora_serving.tasks.whisper_languages import LANGUAGES, TO_LANGUAGE_CODE, resolve

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def whisper_base(demo_models):
    model = demo_models / "whisper-base"
    return model, AutoTokenizer.from_pretrained(model)


@pytest.fixture(scope="module")
def available(whisper_base):
    return whisper_languages.model_languages(*whisper_base)


def language_tokens(tokenizer) -> dict[str, int]:
    """The tokenizer's own language tokens: Whisper's layout puts them right after
    <|startoftranscript|> and before <|translate|>."""
    first = tokenizer.convert_tokens_to_ids("<|startoftranscript|>") + 1
    last = tokenizer.convert_tokens_to_ids("<|translate|>")
    tokens = tokenizer.convert_ids_to_tokens(list(range(first, last)))
    return {token.strip("<|>"): first + i for i, token in enumerate(tokens)}


def test_the_accepted_languages_are_the_tokenizers_language_tokens(available, whisper_base):
    _, tokenizer = whisper_base
    assert available == language_tokens(tokenizer)
    assert len(available) == 99 and "yue" not in available  # whisper-base: 99; v3 adds yue
    assert {"haw", "jw", "su", "ln", "ba"} <= set(available)  # not in vLLM's ISO 639-1 list
    assert list(available) == list(LANGUAGES)[:99]  # openai-whisper's order is the token order


def test_without_lang_to_id_the_tokenizer_names_them(whisper_base, tmp_path):
    _, tokenizer = whisper_base
    assert whisper_languages.model_languages(tmp_path, tokenizer) == language_tokens(tokenizer)


def test_a_lang_to_id_that_disagrees_with_the_tokenizer_is_refused(whisper_base, tmp_path):
    _, tokenizer = whisper_base
    (tmp_path / "generation_config.json").write_text('{"lang_to_id": {"<|en|>": 50260}}')
    with pytest.raises(ConfigError, match=r"lang_to_id disagrees with the tokenizer for <\|en\|>"):
        whisper_languages.model_languages(tmp_path, tokenizer)


class V3Vocabulary:
    """The language tokens of a large-v3 tokenizer (100 languages, <|yue|> last)."""

    def get_vocab(self):
        return {f"<|{code}|>": 50259 + i for i, code in enumerate(LANGUAGES)}


def test_a_v3_vocabulary_has_cantonese(tmp_path):
    available = whisper_languages.model_languages(tmp_path, V3Vocabulary())
    assert len(available) == 100 and available["yue"] == 50358
    assert resolve("Cantonese", available) == resolve("yue", available) == "yue"


@pytest.mark.parametrize(
    "requested, code",
    [
        ("de", "de"),
        (" EN ", "en"),
        ("German", "de"),
        ("javanese", "jw"),
        ("jw", "jw"),
        ("sundanese", "su"),
        ("hawaiian", "haw"),
        ("haitian creole", "ht"),
        ("burmese", "my"),
        ("valencian", "ca"),
        ("castilian", "es"),
        ("mandarin", "zh"),
        ("Moldavian", "ro"),
    ],
)
def test_codes_names_and_aliases_resolve(available, requested, code):
    assert resolve(requested, available) == code


@pytest.mark.parametrize("requested", ["xx", "klingon", "cantonese", "yue", "en-US"])
def test_an_unknown_language_lists_exactly_what_is_valid(available, requested):
    with pytest.raises(InvalidRequest) as error:
        resolve(requested, available)
    message = str(error.value)
    assert message.startswith(f"unknown language '{requested}'; this model knows 99: ")
    listed = message.split(": ", 1)[1].split(" (")[0].split(", ")
    assert sorted(listed) == sorted(available)  # all of them, and nothing the model lacks
    examples = message.split("e.g. ")[1].split(")")[0].split(", ")
    assert all(TO_LANGUAGE_CODE[name] in available for name in examples)
    assert "leave it out to detect" in message


def _openai_whisper_tables() -> tuple[dict, dict]:
    """LANGUAGES and TO_LANGUAGE_CODE's aliases, parsed (not imported) from openai-whisper's
    whisper/tokenizer.py (release 20250625, from its sdist by scripts/whisper_tiktoken.sh)."""
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "whisper_tiktoken.sh"), "-c", _PRINT_ASSETS],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    source = (Path(done.stdout.strip()) / "tokenizer.py").read_text()
    tables = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("LANGUAGES", "TO_LANGUAGE_CODE"):
                tables[name] = {
                    ast.literal_eval(key): ast.literal_eval(value)
                    for key, value in zip(node.value.keys, node.value.values, strict=True)
                    if key is not None  # the **{name: code ...} part
                }
    return tables["LANGUAGES"], tables["TO_LANGUAGE_CODE"]


_PRINT_ASSETS = "import os; print(os.environ['WHISPER_ASSETS'])"


def test_the_tables_are_openai_whispers():
    languages, aliases = _openai_whisper_tables()
    assert list(LANGUAGES.items()) == list(languages.items())  # same order too
    assert TO_LANGUAGE_CODE == {**{name: code for code, name in languages.items()}, **aliases}
