"""The Whisper reference (tests.reference.whisper) with timestamps and previous text.

Regression test: with timestamps transformers 5's generate() returns a dict
({"sequences", "segments"}), and reference_generate failed with
`AttributeError: 'dict' object has no attribute 'sequences'`.
"""

import pytest
import torch

from tests.conftest import load_16k
from tests.reference.whisper import _model_and_features, reference_generate

EOT, SOT, EN, TRANSCRIBE, SOT_PREV, NO_TS, TS = 50257, 50258, 50259, 50359, 50361, 50363, 50364


@pytest.fixture(scope="module")
def fox(speech):
    return load_16k(speech("The quick brown fox jumps over the lazy dog. Then it ran away."))


@pytest.mark.parametrize(
    "prompt",
    [[SOT, EN, TRANSCRIBE], [SOT_PREV, 264, 2068, SOT, EN, TRANSCRIBE]],
    ids=["timestamps", "timestamps-after-previous-text"],
)
def test_reference_generate_with_timestamps(demo_models, fox, prompt):
    base = demo_models / "whisper-base"
    tokens, logprobs = reference_generate(base, None, fox, prompt, 60)
    assert tokens[0] >= TS and tokens[-1] == EOT  # opens with a time, ends with end of text
    assert sum(token >= TS for token in tokens) >= 2 and len(logprobs) == len(tokens)
    assert all(-30 < logprob <= 0 for logprob in logprobs)
    # transformers' own answer for the same window: the tokens before end of text.
    model, features = _model_and_features(base, None, fox)
    with torch.inference_mode():
        own = model.generate(
            features,
            decoder_input_ids=torch.tensor([prompt]),
            language="en",
            task="transcribe",
            return_timestamps=True,
            max_new_tokens=60,
        )
    assert tokens[:-1] == own[0].tolist()


def test_reference_generate_without_timestamps_is_unchanged(demo_models, fox):
    tokens, logprobs = reference_generate(
        demo_models / "whisper-base", None, fox, [SOT, EN, TRANSCRIBE, NO_TS], 60
    )
    assert tokens[-1] == EOT and all(token < EOT for token in tokens[:-1])
    assert len(logprobs) == len(tokens)
