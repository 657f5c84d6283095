"""Word error rate and domain-term recall, both after Whisper's English normaliser.

The normaliser (transformers' EnglishTextNormalizer, as in Whisper's published WER figures)
lower-cases and drops punctuation, so "Zorvexa," and "zorvexa" are the same word.
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache


@lru_cache(maxsize=1)
def _normaliser():
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    return EnglishTextNormalizer({})


def words(text: str) -> list[str]:
    return _normaliser()(text).split()


def edit_distance(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    """Levenshtein distance over words: substitutions + deletions + insertions."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref_word in enumerate(reference, start=1):
        current = [i]
        for j, hyp_word in enumerate(hypothesis, start=1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref_word != hyp_word))
            )
        previous = current
    return previous[-1]


def terms_found(terms: Sequence[str], hypothesis: str) -> int:
    """How many of the spoken terms appear in the hypothesis (a term said twice counts twice)."""
    heard = Counter(words(hypothesis))
    wanted = Counter(word for term in terms for word in words(term))
    return sum(min(count, heard[word]) for word, count in wanted.items())


@dataclass(frozen=True)
class Score:
    """Errors over a set of sentences; rates are over all of their words / terms together."""

    word_errors: int
    reference_words: int
    terms_found: int
    terms_spoken: int

    @property
    def word_error_rate(self) -> float:
        return self.word_errors / max(self.reference_words, 1)

    @property
    def term_recall(self) -> float:
        return self.terms_found / self.terms_spoken if self.terms_spoken else 1.0

    @property
    def term_error_rate(self) -> float:
        return 1.0 - self.term_recall


def score(
    references: Sequence[str], hypotheses: Sequence[str], terms: Sequence[Sequence[str]]
) -> Score:
    pairs = list(zip(references, hypotheses, terms, strict=True))
    return Score(
        word_errors=sum(edit_distance(words(r), words(h)) for r, h, _ in pairs),
        reference_words=sum(len(words(r)) for r, _, _ in pairs),
        terms_found=sum(terms_found(t, h) for _, h, t in pairs),
        terms_spoken=sum(len(words(" ".join(t))) for _, _, t in pairs),
    )
