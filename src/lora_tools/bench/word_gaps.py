"""Speech with known word times: espeak-ng words joined by measured silences.

The truth for word-timing checks (tests/e2e/test_whisper_word_timestamps.py and the bench's word
line): each word is synthesised alone, decoded and resampled to 16 kHz as the server does
(lora_serving.audio), trimmed to its first and last audible sample, and placed after a silence
of known length, so every word's start and end are known to the sample. A word after a long
pause is where openai-whisper's DTW timings start words early (the word absorbs the silence).
"""

import io
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RATE = 16_000
WORDS = ("apple", "river", "window", "yellow", "garden", "morning")
GAPS_S = (0.6, 1.0, 1.4, 0.8, 1.2)  # between consecutive words: 0.6-1.4 s
LEAD_S = 0.5  # silence before the first word and after the last
AUDIBLE = 0.01  # of the word's peak: its first and last audible sample


@dataclass(frozen=True)
class TimedWord:
    word: str
    start: float  # seconds from the clip's start
    end: float


@dataclass(frozen=True)
class GapClip:
    samples: np.ndarray  # 16 kHz mono float32
    words: tuple[TimedWord, ...]

    def wav(self) -> bytes:
        """The samples as a float32 WAV file (the server decodes it to the same samples)."""
        import soundfile

        buffer = io.BytesIO()
        soundfile.write(buffer, self.samples, RATE, format="WAV", subtype="FLOAT")
        return buffer.getvalue()


def spoken_word(word: str, voice: str = "en-us", speed: int = 150) -> np.ndarray:
    """One word from espeak-ng, 16 kHz, trimmed to its audible part."""
    from lora_serving.audio import decode_audio_file, to_whisper_input

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "word.wav"
        subprocess.run(
            ["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(path), word], check=True
        )
        samples, rate = decode_audio_file(path.read_bytes(), max_seconds=30)
    samples = to_whisper_input(samples, rate, max_seconds=30)
    audible = np.flatnonzero(np.abs(samples) > AUDIBLE * np.abs(samples).max())
    return samples[audible[0] : audible[-1] + 1].astype(np.float32)


def gap_clip(words=WORDS, gaps_s=GAPS_S, lead_s=LEAD_S) -> GapClip:
    """The words with `gaps_s` of digital silence between them, and each word's true times."""
    assert len(gaps_s) == len(words) - 1
    pieces = [np.zeros(round(lead_s * RATE), np.float32)]
    timed = []
    at = len(pieces[0])
    for index, word in enumerate(words):
        spoken = spoken_word(word)
        timed.append(TimedWord(word, at / RATE, (at + len(spoken)) / RATE))
        pieces.append(spoken)
        at += len(spoken)
        gap = gaps_s[index] if index < len(gaps_s) else lead_s
        pieces.append(np.zeros(round(gap * RATE), np.float32))
        at += len(pieces[-1])
    return GapClip(np.concatenate(pieces), tuple(timed))


def bare(word: str) -> str:
    """A transcribed word compared with the truth: lower case, no punctuation or spaces."""
    return "".join(ch for ch in word.lower() if ch.isalnum())
