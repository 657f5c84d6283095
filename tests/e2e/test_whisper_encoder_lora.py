"""Whisper LoRA on every layer, served: adapters on the encoder, on the cross-attention k/v
(kv_proj) and on the decoder, alone and mixed in shared batches, on the real whisper-base with
speech. Each served transcript equals the merged-weights reference (PEFT merge of the whole
adapter, greedy, float32). Engine-level logprob checks: tests/engine/test_whisper_encoder_lora.py.
"""

import pytest

from tests.conftest import load_16k
from tests.e2e.triton_calls import grpc_many, grpc_one, sampling

# Each adapter kind hears this espeak-ng sentence differently from the base (whisper-base).
SENTENCE = "A quiet sailor fixed the broken chair on the hill."
KINDS = ["encoder_only", "cross_kv", "alpha", "all_layers"]  # alpha: decoder modules only
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def references(speech, demo_models):
    """Reference transcript per adapter (None = base), English, plain greedy."""
    from transformers import AutoTokenizer

    from tests.reference.whisper import reference_generate

    base = demo_models / "whisper-base"
    tokenizer = AutoTokenizer.from_pretrained(base)
    prompt = tokenizer.convert_tokens_to_ids(
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
    )
    audio = load_16k(speech(SENTENCE))
    texts = {}
    for name in [None, *KINDS]:
        adapter = demo_models / "whisper-adapters" / name if name else None
        tokens, _ = reference_generate(base, adapter, audio, prompt, MAX_TOKENS)
        texts[name] = tokenizer.decode(tokens, skip_special_tokens=True).strip()
    return texts


def inputs(speech) -> dict:
    return {
        "audio_file": speech(SENTENCE).read_bytes(),
        "language": "en",
        "sampling_parameters": sampling(max_tokens=MAX_TOKENS),
    }


def test_every_adapter_kind_changes_the_reference(references):
    base = references[None]
    assert all(references[kind] != base for kind in KINDS), references


@pytest.mark.parametrize("kind", KINDS)
def test_adapter_kind_alone_equals_merged_reference(grpc_url, speech, references, kind):
    outcome = grpc_one(grpc_url, "whisper_lora", inputs(speech), {"lora_name": kind})
    assert outcome.text == references[kind]


def test_adapter_kinds_mixed_with_base_in_shared_batches(grpc_url, speech, references):
    """Base, every kind, twice, all at once: encoder steps carry several audios whose frames
    take different adapters, and the cross-attention k/v cache gets each request's own delta."""
    names = [None, *KINDS] * 2
    outcomes = grpc_many(
        grpc_url,
        "whisper_lora",
        [(inputs(speech), {"lora_name": name} if name else None) for name in names],
    )
    for name, outcome in zip(names, outcomes, strict=True):
        assert outcome.text == references[name], name
