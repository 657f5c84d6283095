"""Beam search for one Whisper window, step by step over engine requests.

The search is transformers' `generate(num_beams=N)` (its `_beam_search`, default
`early_stopping=False`), rule for rule, so a served beam search equals the reference token for
token:
- a beam's score is the sum of its tokens' log-probabilities: log_softmax of the raw logits, with
  suppressed tokens removed and NOT renormalised (transformers' processors set -inf on the
  log-probabilities);
- each step keeps the 2N best continuations of all running beams; of the best N of them, those
  ending in <|endoftext|> (or reaching max_tokens) become finished hypotheses, scored
  sum / generated_length ** length_penalty; the best N that did not end run on;
- the search stops when N hypotheses are finished and the best running beam, scored at its
  current length, can no longer beat the worst of them (transformers' heuristic), or at
  max_tokens.

`patience` (openai-whisper's and faster-whisper's option) widens the finished pool to
round(N * patience) hypotheses before the search may stop; 1.0 (the default) is transformers'.
openai-whisper ranks by length differently when `length_penalty` is set (((5 + L) / 6) ** p);
here `length_penalty` is transformers' exponent, and the default 1.0 (divide by the length)
is also openai-whisper's default ranking.

The engine gives each step's log-probabilities: one request per running beam (the window's
decoder prompt plus the beam's tokens, one token generated, top-k log-probabilities). Our vLLM
plugin reuses the window's encoder output for all of them (vllm_plugin/whisper_encoder_memo).
"""

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

# Tokens generated so far on one beam -> log-probability of each candidate next token (at least
# the best `top_k_needed` of the unsuppressed ones).
Scorer = Callable[[list[int]], Awaitable[dict[int, float]]]
MAX_BEAM_SIZE = 16


@dataclass(frozen=True)
class BeamOptions:
    size: int
    length_penalty: float = 1.0
    patience: float = 1.0

    @property
    def pool_size(self) -> int:
        return max(self.size, round(self.size * self.patience))

    def top_k_needed(self, suppressed: int) -> int:
        """Log-probabilities each step must return so the 2N best unsuppressed ones are among
        them, however many of the `suppressed` tokens rank above them."""
        return 2 * self.size + suppressed


@dataclass(frozen=True)
class BeamResult:
    tokens: list[int]
    logprobs: list[float]  # each token's, as scored
    sum_logprob: float
    score: float  # sum_logprob / len(tokens) ** length_penalty
    finish_reason: str  # "stop" (ended in end of text) or "length"


async def beam_search(
    score_next: Scorer,
    *,
    options: BeamOptions,
    max_tokens: int,
    end_of_text: int,
    suppress: frozenset[int] = frozenset(),
    suppress_at_begin: frozenset[int] = frozenset(),
) -> BeamResult:
    width = options.size
    # Sums in float32, as transformers keeps beam scores: near-ties then break the same way.
    f32 = np.float32
    running: list[tuple[float, list[int], list[float]]] = [(f32(0.0), [], [])]
    finished: list[tuple[float, float, list[int], list[float]]] = []  # score, sum, tokens, each
    improvable = True
    for step in range(max_tokens):
        scored = await asyncio.gather(*(score_next(tokens) for _, tokens, _ in running))
        barred = suppress | suppress_at_begin if step == 0 else suppress
        candidates = [
            (f32(total + f32(logprob)), tokens + [token], each + [logprob])
            for (total, tokens, each), logprobs in zip(running, scored, strict=True)
            for token, logprob in logprobs.items()
            if token not in barred
        ]
        # Best first; among equal scores, the earlier beam and the lower token id (torch.topk
        # over beam-major scores keeps that order in practice).
        candidates.sort(key=lambda item: -item[0])
        best = candidates[: 2 * width]
        last_step = step + 1 >= max_tokens
        ended = [last_step or tokens[-1] == end_of_text for _, tokens, _ in best]
        if improvable:
            for (total, tokens, each), done in zip(best[:width], ended[:width], strict=False):
                if done:
                    score = f32(total / f32(step + 1) ** f32(options.length_penalty))
                    finished.append((score, total, tokens, each))
            finished.sort(key=lambda item: -item[0])
            del finished[options.pool_size :]
        if all(ended):
            break
        running = [item for item, done in zip(best, ended, strict=True) if not done][:width]
        best_possible = f32(running[0][0] / f32(step + 1) ** f32(options.length_penalty))
        if len(finished) >= options.pool_size and best_possible <= finished[-1][0]:
            improvable = False
        if not improvable:
            break
    score, total, tokens, each = finished[0]
    reason = "stop" if tokens[-1] == end_of_text else "length"
    return BeamResult(
        tokens=tokens,
        logprobs=each,
        sum_logprob=float(total),
        score=float(score),
        finish_reason=reason,
    )
