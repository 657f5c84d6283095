"""Partial text that is never retracted: whisper_streaming's local agreement, word level.

Each re-decode of the turn so far is a hypothesis. A word is stable once two consecutive
hypotheses agree on it and on every word before it; the last word of the newest hypothesis is
never stable (the audio may cut it). Only stable text is sent, as deltas that are character
prefixes of the hypothesis text, so their concatenation is always a prefix of what was decoded.
At the end of the turn the whole decode is the truth: `finish` gives the rest of it when the
sent text is its prefix (the usual case), "" when the final decode changed a sent word. That can
happen (two partials agreed on a word the whole turn decodes otherwise), so the session then
decodes the turn again continuing from the sent text (Whisper's `prefix`) and completes the turn
with `continued(sent, that decode)`: a delta is never retracted.
"""

import re
import unicodedata

_WORD = re.compile(r"\S+")


def word_ends(text: str) -> list[int]:
    """Character offsets just after each word of `text`."""
    return [match.end() for match in _WORD.finditer(text)]


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


class LocalAgreement:
    def __init__(self):
        self.sent = ""  # the concatenation of every delta sent for this turn
        self._previous: list[str] | None = None

    def update(self, hypothesis: str) -> str:
        """The next delta ("" when nothing new is stable) after one more hypothesis."""
        words = _words(hypothesis)
        previous, self._previous = self._previous, words
        if previous is None:
            return ""
        agreed = 0
        for old, new in zip(previous, words[:-1], strict=False):
            if old != new:
                break
            agreed += 1
        if agreed == 0:
            return ""
        stable = hypothesis[: word_ends(hypothesis)[agreed - 1]]
        if len(stable) <= len(self.sent) or not stable.startswith(self.sent):
            return ""
        delta, self.sent = stable[len(self.sent) :], stable
        return delta

    def finish(self, final_text: str) -> str:
        """The last delta of the turn: the final text after what was sent."""
        if not final_text.startswith(self.sent):
            return ""
        delta, self.sent = final_text[len(self.sent) :], final_text
        return delta


def continued(sent: str, continuation: str) -> str:
    """The turn's text when its decode was made to continue from `sent`: a space between the two
    unless the continuation starts with punctuation (the transcript's text comes stripped)."""
    rest = continuation.strip()
    if not rest or not sent:
        return sent + rest
    joined = sent[-1].isspace() or unicodedata.category(rest[0]).startswith("P")
    return sent + rest if joined else f"{sent} {rest}"
