"""Beam search for one Whisper window, step by step over engine requests, by either of two rules.

`beam_rule` "transformers" is transformers' `generate(num_beams=N)` (its
`_beam_search`, default `early_stopping=False`), rule for rule, so a served beam search equals the
reference token for token:
- a beam's score is the sum of its tokens' log-probabilities: log_softmax of the raw logits, with
  suppressed tokens removed and NOT renormalised (transformers' processors set -inf on the
  log-probabilities);
- each step keeps the 2N best continuations of all running beams; of the best N of them, those
  ending in <|endoftext|> (or reaching max_tokens) become finished hypotheses, scored
  sum / generated_length ** length_penalty; the best N that did not end run on;
- the search stops when N hypotheses are finished and the best running beam, scored at its
  current length, can no longer beat the worst of them (transformers' heuristic), or at
  max_tokens.
`patience` widens the finished pool to round(N * patience) hypotheses before the search may stop.

`beam_rule` "faster-whisper" (the default: what speech teams compare with, and the meaning
openai-whisper gives `patience`) is CTranslate2's search as faster-whisper runs it (openai-whisper's
differs only in details noted below):
- log-probabilities are taken AFTER Whisper's decoding rules (suppression, timestamp rules) and
  renormalised: the engine applies the rules and returns log_softmax of the processed logits;
- each step ranks the 2N best continuations; those among the best N that end in <|endoftext|>
  (or reach max_tokens) are finished, each replaced by the next unfinished one of the other N;
- the search stops as soon as round(N * patience) hypotheses are finished (no heuristic);
- finished hypotheses are ranked by sum / length ** length_penalty, the length without
  <|endoftext|>.
openai-whisper takes N + 1 continuations per beam rather than 2N overall, counts a finished one
only if it ranks above the N-th unfinished continuation, and keeps at most round(N * patience);
with a `length_penalty` it ranks by ((5 + L) / 6) ** p, which neither rule here does. Because the
engine applies the rules, this rule also decodes with timestamps.

The engine gives each step's log-probabilities: one request per running beam (the window's
decoder prompt plus the beam's tokens, one token generated, top-k log-probabilities). Our vLLM
plugin reuses the window's encoder output for all of them (vllm_plugin/whisper_encoder_memo).
"""

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

# Tokens generated so far on one beam -> log-probability of each candidate next token (at least
# the best `top_k_needed` of the unsuppressed ones).
Scorer = Callable[[list[int]], Awaitable[dict[int, float]]]
MAX_BEAM_SIZE = 16
TRANSFORMERS, FASTER_WHISPER = "transformers", "faster-whisper"
BEAM_RULES = (TRANSFORMERS, FASTER_WHISPER)


@dataclass(frozen=True)
class BeamOptions:
    size: int
    length_penalty: float = 1.0
    patience: float = 1.0
    rule: str = TRANSFORMERS  # whisper_options.DEFAULTS holds the served default

    @property
    def pool_size(self) -> int:
        return max(self.size, round(self.size * self.patience))

    @property
    def rules_in_engine(self) -> bool:
        """Whether each step's log-probabilities come after Whisper's decoding rules, renormalised
        (faster-whisper's rule), rather than raw with suppressed tokens skipped here."""
        return self.rule == FASTER_WHISPER

    def top_k_needed(self, suppressed: int) -> int:
        """Log-probabilities each step must return so the 2N best allowed ones are among them,
        however many of the `suppressed` tokens rank above them (none when the engine applies
        the rules)."""
        return 2 * self.size + (0 if self.rules_in_engine else suppressed)


@dataclass(frozen=True)
class BeamResult:
    tokens: list[int]
    logprobs: list[float]  # each token's, as scored
    sum_logprob: float
    score: float  # sum_logprob / length ** length_penalty, the length as its rule counts it
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
    """`suppress` / `suppress_at_begin` are skipped here for the transformers rule; with the
    faster-whisper rule the scorer's log-probabilities already obey them."""
    if options.rules_in_engine:
        return await _ctranslate2_search(
            score_next, options=options, max_tokens=max_tokens, end_of_text=end_of_text
        )
    return await _transformers_search(
        score_next,
        options=options,
        max_tokens=max_tokens,
        end_of_text=end_of_text,
        barred_always=suppress,
        barred_first=suppress | suppress_at_begin,
    )


# A beam: (sum of its log-probabilities, its tokens, each token's log-probability).
Beam = tuple[float, list[int], list[float]]


async def _best_continuations(
    score_next: Scorer, running: list[Beam], width: int, barred: frozenset[int]
) -> list[Beam]:
    """The 2N best one-token continuations of the running beams, best first, with float32 sums
    (as both transformers and CTranslate2 keep beam scores: near-ties break the same way).
    Among equal sums the earlier beam comes first, then the scorer's order (a stable sort over
    beam-major candidates, as torch.topk and CTranslate2's top-k keep them in practice). Barred
    tokens and tokens the engine's rules forbid (-inf) are never continuations."""
    f32 = np.float32
    scored = await asyncio.gather(*(score_next(tokens) for _, tokens, _ in running))
    candidates = [
        (f32(total + f32(logprob)), tokens + [token], each + [logprob])
        for (total, tokens, each), logprobs in zip(running, scored, strict=True)
        for token, logprob in logprobs.items()
        if token not in barred and logprob > -math.inf
    ]
    candidates.sort(key=lambda item: -item[0])
    return candidates[: 2 * width]


async def _transformers_search(
    score_next: Scorer, *, options, max_tokens, end_of_text, barred_always, barred_first
) -> BeamResult:
    width = options.size
    f32 = np.float32
    running: list[Beam] = [(f32(0.0), [], [])]
    finished: list[tuple[float, float, list[int], list[float]]] = []  # score, sum, tokens, each
    improvable = True
    for step in range(max_tokens):
        barred = barred_first if step == 0 else barred_always
        best = await _best_continuations(score_next, running, width, barred)
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


async def _ctranslate2_search(
    score_next: Scorer, *, options: BeamOptions, max_tokens: int, end_of_text: int
) -> BeamResult:
    width = options.size
    running: list[Beam] = [(np.float32(0.0), [], [])]
    finished: list[Beam] = []
    for step in range(max_tokens):
        best = await _best_continuations(score_next, running, width, frozenset())
        last_step = step + 1 >= max_tokens
        ends = [tokens[-1] == end_of_text for _, tokens, _ in best]
        running, spare = [], width
        for k, candidate in enumerate(best[:width]):
            if not (ends[k] or last_step):
                running.append(candidate)
                continue
            finished.append(candidate)
            # Its place goes to the next continuation of the other N that has not ended.
            for j in range(spare, len(best)):
                if not ends[j]:
                    running.append(best[j])
                    spare = j + 1
                    break
        if last_step or len(finished) >= options.pool_size or not running:
            break

    def ranked(item) -> float:
        total, tokens, _ = item
        length = len(tokens) - (tokens[-1] == end_of_text)
        divisor = length**options.length_penalty  # 0 ** 0 is 1, as std::pow's
        return float(total) / divisor if divisor else -math.inf

    best_total, tokens, each = max(finished, key=ranked)  # the first of equals, as a stable sort
    return BeamResult(
        tokens=tokens,
        logprobs=each,
        sum_logprob=float(best_total),
        score=ranked((best_total, tokens, each)),
        finish_reason="stop" if tokens[-1] == end_of_text else "length",
    )
