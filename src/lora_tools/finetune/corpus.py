"""A domain whisper-base gets wrong: invented drug names spoken in short sentences.

Every name occurs in training; held-out sentences use templates that never occur in training,
and their two-name pairs never occur together in training, so a held-out sentence is never a
training sentence with another voice. Speech comes from espeak-ng with several English voices
and speeds, chosen per sentence by a seeded generator: the same seed gives the same corpus.
"""

import hashlib
import random
import shutil
import subprocess
from dataclasses import dataclass
from itertools import permutations
from pathlib import Path

import numpy as np

TERMS = (
    "Zorvexa",
    "Quintaprel",
    "Mivoltrane",
    "Kyrdalix",
    "Phorzenta",
    "Xylobrane",
    "Quellitax",
    "Brivanthe",
    "Cytravone",
    "Ozemblyn",
    "Trevasquil",
    "Lumiphrex",
)
TRAIN_TEMPLATES = (
    "The patient was given {a} twice a day.",
    "Please order more {a} for the pharmacy.",
    "She switched from {a} to {b} last week.",
    "Take one tablet of {a} after dinner.",
    "The doctor prescribed {a} for the pain.",
    "Do not mix {a} with {b}.",
    "Our new shipment of {a} arrived today.",
    "He asked whether {a} causes drowsiness.",
    "Store {a} in a cool and dry place.",
    "The trial compared {a} and {b}.",
    "Is {a} covered by your insurance?",
    "A lower dose of {a} worked better.",
    "The nurse checked the {a} label again.",
    "We ran out of {a} on Friday.",
    "Keep {a} away from children.",
    "The price of {a} went up this year.",
)
HELD_OUT_TEMPLATES = (
    "Her prescription for {a} was renewed this morning.",
    "Can I take {a} together with {b}?",
    "The pharmacist explained how {a} should be used.",
    "Write {a} on the form, not {b}.",
    "He felt much better after a week of {a}.",
    "Bring the {a} to room four, please.",
)
HELD_OUT_PER_TEMPLATE = 4  # sentences per held-out template (names rotate through TERMS)
# Ordinary speech with no domain names: the base model's output on it must not change.
ORDINARY_SENTENCES = (
    "She opened the window and listened to the birds singing.",
    "The train to the city leaves early in the morning.",
    "Please put the green book back on the top shelf.",
    "My brother likes to cook pasta on Sunday evenings.",
    "It was raining heavily when we arrived at the station.",
    "Could you tell me the way to the nearest post office?",
    "We need to buy bread, milk and eggs for breakfast.",
    "The meeting has been moved to next Tuesday afternoon.",
)
VOICES = ("en", "en-us", "en-gb-x-rp", "en-gb-scotland", "en-029", "en-us-nyc")
SPEEDS = (130, 145, 160, 175)  # words per minute
ORDINARY_VOICE, ORDINARY_SPEED = "en", 150


@dataclass(frozen=True)
class Utterance:
    """One sentence to synthesise, with the domain names it contains."""

    text: str
    terms: tuple[str, ...]
    voice: str
    speed: int

    def file_name(self) -> str:
        key = f"{self.voice}|{self.speed}|{self.text}".encode()
        return hashlib.sha1(key).hexdigest()[:16] + ".wav"


@dataclass(frozen=True)
class Split:
    train: tuple[Utterance, ...]
    held_out: tuple[Utterance, ...]
    ordinary: tuple[Utterance, ...]


def _slots(template: str) -> int:
    return template.count("{b}") + 1


def _fill(template: str, pair: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    names = dict(zip("ab", pair, strict=False))
    return template.format(**names), pair[: _slots(template)]


def _training_pairs(terms: tuple[str, ...]) -> list[list[tuple[str, str]]]:
    """Per two-name training template, one second name per first name: (a, a+1+k)."""
    count = len(terms)
    two_name = [t for t in TRAIN_TEMPLATES if _slots(t) == 2]
    return [
        [(terms[i], terms[(i + 1 + k) % count]) for i in range(count)] for k in range(len(two_name))
    ]


def build_split(seed: int = 0, terms: tuple[str, ...] = TERMS) -> Split:
    """Training: every template with every name; held-out: new templates, new name pairs."""
    rng = random.Random(seed)

    def voiced(text: str, names: tuple[str, ...]) -> Utterance:
        return Utterance(text, names, rng.choice(VOICES), rng.choice(SPEEDS))

    train = []
    pairs_by_template = iter(_training_pairs(terms))
    seen_pairs = set()
    for template in TRAIN_TEMPLATES:
        pairs = next(pairs_by_template) if _slots(template) == 2 else [(t,) for t in terms]
        for pair in pairs:
            seen_pairs.update(permutations(pair, 2))
            train.append(voiced(*_fill(template, pair)))

    unseen_pairs = [p for p in permutations(terms, 2) if p not in seen_pairs]
    rng.shuffle(unseen_pairs)
    unseen = iter(unseen_pairs)
    held_out = []
    for number, template in enumerate(HELD_OUT_TEMPLATES):
        for k in range(HELD_OUT_PER_TEMPLATE):
            first = terms[(number * HELD_OUT_PER_TEMPLATE + k) % len(terms)]
            pair = next(unseen) if _slots(template) == 2 else (first,)
            held_out.append(voiced(*_fill(template, pair)))
    ordinary = [Utterance(s, (), ORDINARY_VOICE, ORDINARY_SPEED) for s in ORDINARY_SENTENCES]
    return Split(tuple(train), tuple(held_out), tuple(ordinary))


def synthesise(utterance: Utterance, folder: Path) -> Path:
    """espeak-ng speech as a WAV file in `folder` (kept: the name is a hash of the inputs)."""
    path = Path(folder) / utterance.file_name()
    if path.exists():
        return path
    if not shutil.which("espeak-ng"):
        raise RuntimeError("espeak-ng is not installed: run `make setup`")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")
    command = ["espeak-ng", "-v", utterance.voice, "-s", str(utterance.speed), "-w", str(partial)]
    subprocess.run([*command, utterance.text], check=True, capture_output=True)
    partial.rename(path)
    return path


def load_16k(path: Path) -> np.ndarray:
    """The decode and resampling the server applies, so training sees the served samples."""
    from lora_serving.audio import decode_audio_file, to_whisper_input

    samples, rate = decode_audio_file(Path(path).read_bytes(), max_seconds=30)
    return to_whisper_input(samples, rate, max_seconds=30)
