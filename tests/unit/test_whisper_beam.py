"""Our step-by-step beam search equals transformers' `generate(num_beams=N)` token for token.

A small random GPT-2 stands in for the engine: each step's scorer gives log_softmax of its raw
logits for the beam's prefix, as the engine's top-k log-probabilities would. transformers runs
its own beam search on the same model with the same suppression lists.
The random model rarely ends a sentence, so both searches see end of text made likelier with
every token (the same bonus on its log-probability, as a transformers logits processor adds it).
"""

import asyncio
import math

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from lora_serving.tasks.whisper_beam import FASTER_WHISPER, BeamOptions, beam_search

VOCAB, EOS = 48, 7
PROMPT = [3, 11, 5]
EOS_BONUS_PER_TOKEN = 0.3


def eos_bonus(logprobs: torch.Tensor, generated: int) -> torch.Tensor:
    logprobs = logprobs.clone()
    logprobs[..., EOS] += EOS_BONUS_PER_TOKEN * generated
    return logprobs


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=EOS,
        eos_token_id=EOS,
    )
    return GPT2LMHeadModel(config).eval()


def reference(model, *, beams, max_tokens, suppress, at_begin, length_penalty=1.0):
    from transformers import LogitsProcessorList

    def bonus(input_ids, scores):
        return eos_bonus(scores, input_ids.shape[-1] - len(PROMPT))

    with torch.inference_mode():
        out = model.generate(
            torch.tensor([PROMPT]),
            num_beams=beams,
            do_sample=False,
            max_new_tokens=max_tokens,
            length_penalty=length_penalty,
            suppress_tokens=list(suppress) or None,
            begin_suppress_tokens=list(at_begin) or None,
            pad_token_id=EOS,
            eos_token_id=EOS,
            logits_processor=LogitsProcessorList([bonus]),
        )
    tokens = out[0, len(PROMPT) :].tolist()
    return tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens


def ours(model, *, beams, max_tokens, suppress, at_begin, length_penalty=1.0, patience=1.0):
    calls = []

    async def score_next(tokens):
        calls.append(len(tokens))
        with torch.inference_mode():
            logits = model(torch.tensor([PROMPT + tokens])).logits[0, -1].float()
        logprobs = eos_bonus(torch.log_softmax(logits, dim=-1), len(tokens))
        top = torch.topk(logprobs, BeamOptions(beams).top_k_needed(len(suppress | at_begin)))
        return dict(zip(top.indices.tolist(), top.values.tolist(), strict=True))

    result = asyncio.run(
        beam_search(
            score_next,
            options=BeamOptions(beams, length_penalty=length_penalty, patience=patience),
            max_tokens=max_tokens,
            end_of_text=EOS,
            suppress=frozenset(suppress),
            suppress_at_begin=frozenset(at_begin),
        )
    )
    return result, calls


@pytest.mark.parametrize("beams", [2, 3, 5])
@pytest.mark.parametrize("max_tokens", [4, 12, 30])
def test_beam_search_equals_transformers(model, beams, max_tokens):
    suppress, at_begin = {0, 1, 2, 9}, {EOS, 4}
    expected = reference(
        model, beams=beams, max_tokens=max_tokens, suppress=suppress, at_begin=at_begin
    )
    result, calls = ours(
        model, beams=beams, max_tokens=max_tokens, suppress=suppress, at_begin=at_begin
    )
    assert result.tokens == expected
    assert result.finish_reason == ("stop" if expected[-1] == EOS else "length")
    assert not set(result.tokens) & suppress and result.tokens[0] not in at_begin
    assert calls[0] == 0 and len(calls) <= 1 + beams * (max_tokens - 1)


@pytest.mark.parametrize("length_penalty", [0.0, 2.0])
def test_length_penalty_is_transformers_exponent(model, length_penalty):
    kwargs = dict(beams=4, max_tokens=20, suppress=set(), at_begin={EOS})
    expected = reference(model, length_penalty=length_penalty, **kwargs)
    result, _ = ours(model, length_penalty=length_penalty, **kwargs)
    assert result.tokens == expected


def test_a_search_cut_at_max_tokens_says_length(model):
    result, _ = ours(model, beams=3, max_tokens=2, suppress={EOS}, at_begin=set())
    assert len(result.tokens) == 2 and result.finish_reason == "length"


def test_patience_keeps_searching_for_more_hypotheses(model):
    kwargs = dict(beams=2, max_tokens=30, suppress=set(), at_begin={EOS})
    _, plain_calls = ours(model, **kwargs)
    _, patient_calls = ours(model, patience=3.0, **kwargs)
    assert len(patient_calls) > len(plain_calls)


# ---- faster-whisper's rule (CTranslate2's search) ----------------------------------------------
END = 0


def table_scorer(table: dict[tuple[int, ...], dict[int, float]], calls: list):
    """Each prefix's next-token probabilities from a table, as log-probabilities."""

    async def score_next(tokens):
        calls.append(tuple(tokens))
        return {token: math.log(p) for token, p in table[tuple(tokens)].items()}

    return score_next


def faster_whisper_search(table, *, beams=2, max_tokens=10, **options):
    calls = []
    result = asyncio.run(
        beam_search(
            table_scorer(table, calls),
            options=BeamOptions(beams, rule=FASTER_WHISPER, **options),
            max_tokens=max_tokens,
            end_of_text=END,
        )
    )
    return result, calls


# Two beams. After [1] and [2], the two best continuations end: 2 hypotheses are finished.
TABLE = {
    (): {1: 0.6, 2: 0.4},
    (1,): {END: 0.55, 3: 0.45},
    (2,): {END: 0.9, 4: 0.1},
    (1, 3): {END: 1.0},
    (2, 4): {END: 1.0},
}


def test_faster_whisper_rule_stops_once_n_hypotheses_are_finished():
    result, calls = faster_whisper_search(TABLE)
    # [1, END] 0.33 and [2, END] 0.36 are the best two of step 2: both finished, search over.
    assert calls == [(), (1,), (2,)]
    # Ranked by sum / length without end of text: log 0.36 / 1 beats log 0.33 / 1.
    assert result.tokens == [2, END] and result.finish_reason == "stop"
    assert result.sum_logprob == pytest.approx(math.log(0.36), rel=1e-6)
    assert result.score == pytest.approx(math.log(0.36), rel=1e-6)


def test_faster_whisper_rule_replaces_finished_beams_and_patience_widens_the_pool():
    table = {
        (): {1: 0.5, 2: 0.499},
        (1,): {END: 0.7, 3: 0.3},
        (2,): {5: 0.2, 6: 0.1, END: 0.699},
        (1, 3): {END: 1.0},
        (2, 5): {END: 1.0},
    }
    result, calls = faster_whisper_search(table)
    # Step 2, best first: [1,END] .35, [2,END] .349, [1,3] .15, [2,5] .0998: the best two
    # ended (2 hypotheses: stop); their places would go to [1,3] and [2,5].
    assert calls == [(), (1,), (2,)] and result.tokens == [1, END]
    widened, calls = faster_whisper_search(table, patience=2.0)  # 4 hypotheses wanted
    assert calls == [(), (1,), (2,), (1, 3), (2, 5)]
    # log .15 / 2 = -0.95 now beats log .35 / 1 = -1.05
    assert widened.tokens == [1, 3, END]


@pytest.mark.parametrize("length_penalty, expected", [(1.0, [1, 2, END]), (0.0, [END])])
def test_faster_whisper_rule_ranks_by_length_without_end_of_text(length_penalty, expected):
    table = {(): {1: 0.6, END: 0.4}, (1,): {2: 0.6, END: 0.4}, (1, 2): {END: 1.0}}
    # Finished: [END] (log .4, length 0), [1,END] (log .24, 1), [1,2,END] (log .36, 2).
    result, _ = faster_whisper_search(table, patience=2.0, length_penalty=length_penalty)
    assert result.tokens == expected


def test_faster_whisper_rule_at_max_tokens_finishes_the_best_beams():
    table = {(): {1: 0.6, END: 0.4}}
    result, _ = faster_whisper_search(table, max_tokens=1)
    assert result.tokens == [1] and result.finish_reason == "length"


def renormalised_step(model, suppress, at_begin):
    """Each step's log-probabilities as the engine gives them under faster-whisper's rule:
    suppressed tokens removed before log_softmax (renormalised), then the end-of-text bonus."""

    def step(tokens: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = model(torch.tensor([PROMPT + tokens])).logits[0, -1].float()
        logits = logits.clone()  # a normal tensor, writable outside inference mode
        logits[sorted(suppress | (set() if tokens else at_begin))] = -torch.inf
        return eos_bonus(torch.log_softmax(logits, dim=-1), len(tokens))

    return step


@pytest.mark.parametrize("beams", [1, 2, 5])
@pytest.mark.parametrize("max_tokens", [4, 12, 30])
@pytest.mark.parametrize("patience, length_penalty", [(1.0, 1.0), (2.0, 1.0), (1.0, 0.5)])
def test_faster_whisper_rule_equals_the_reference_ctranslate2_search(
    model, beams, max_tokens, patience, length_penalty
):
    """Our faster-whisper rule and the merged-weights reference's CTranslate2 search
    (tests/reference/whisper.py, written apart from it from CTranslate2's decoding.cc) pick the
    same hypothesis on the same steps."""
    from tests.reference.whisper import ctranslate2_beam_search

    step = renormalised_step(model, {0, 1, 2, 9}, {EOS, 4})

    async def score_next(tokens):
        logprobs = step(tokens)
        top = torch.topk(logprobs, 2 * beams)
        return dict(zip(top.indices.tolist(), top.values.tolist(), strict=True))

    options = BeamOptions(
        beams, rule=FASTER_WHISPER, patience=patience, length_penalty=length_penalty
    )
    ours = asyncio.run(
        beam_search(score_next, options=options, max_tokens=max_tokens, end_of_text=EOS)
    )
    hypotheses = ctranslate2_beam_search(
        step,
        beam_size=beams,
        max_length=max_tokens,
        end_id=EOS,
        length_penalty=length_penalty,
        patience=patience,
    )
    assert ours.tokens == hypotheses[0]
