"""tests/openai_whisper/convert.py: a Hugging Face Whisper folder as an openai-whisper checkpoint.

The judge of word timings is openai-whisper (PyPI, its own environment: scripts/openai_whisper.sh)
run on the converted PEFT-merged weights; this proves the conversion: openai-whisper's
transcribe() on converted whisper-base decodes the same tokens as transformers' generate() on the
same samples, and the adapter's merged weights arrive (the converted alpha differs from base
where the adapter trains, and only there).
"""

import pytest
import torch

from tests.conftest import load_16k
from tests.openai_whisper import install_reference_env, reference_transcribe
from tests.openai_whisper.convert import _pad_mlps, convert, openai_name
from tests.reference.whisper import reference_generate

SOT, EN, TRANSCRIBE, EOT = 50258, 50259, 50359, 50257


@pytest.fixture(scope="module")
def checkpoints(request, demo_models, tmp_path_factory):
    install_reference_env(request)
    folder = tmp_path_factory.mktemp("openai_whisper")
    base = demo_models / "whisper-base"
    return {
        "base": convert(base, None, folder / "base.pt"),
        "alpha": convert(base, demo_models / "whisper-adapters" / "alpha", folder / "alpha.pt"),
    }


def test_names_map_both_ways():
    assert openai_name("model.decoder.layers.3.encoder_attn.k_proj.weight") == (
        "decoder.blocks.3.cross_attn.key.weight"
    )
    assert openai_name("model.encoder.embed_positions.weight") == "encoder.positional_embedding"
    assert openai_name("model.encoder.layers.0.fc2.bias") == "encoder.blocks.0.mlp.2.bias"
    assert openai_name("proj_out.weight") is None  # tied to the token embedding
    with pytest.raises(ValueError, match="no openai-whisper place"):
        openai_name("model.decoder.layers.0.unknown.weight")


def test_a_narrower_mlp_gets_zero_units_that_change_nothing():
    """openai-whisper's MLP is 4 x d_model wide (the v3 shape's is narrower)."""
    generator = torch.Generator().manual_seed(0)
    fc1, bias, fc2 = (torch.randn(*shape, generator=generator) for shape in ((6, 4), (6,), (4, 6)))
    prefix = "encoder.blocks.0.mlp"
    state = {f"{prefix}.0.weight": fc1, f"{prefix}.0.bias": bias, f"{prefix}.2.weight": fc2}
    _pad_mlps(state, 16)
    wide1, wide_bias, wide2 = (state[f"{prefix}.{n}"] for n in ("0.weight", "0.bias", "2.weight"))
    assert wide1.shape == (16, 4) and wide_bias.shape == (16,) and wide2.shape == (4, 16)
    x = torch.randn(3, 4, generator=generator)
    gelu = torch.nn.functional.gelu
    assert torch.allclose(gelu(x @ wide1.T + wide_bias) @ wide2.T, gelu(x @ fc1.T + bias) @ fc2.T)


def test_checkpoint_carries_merged_weights_and_alignment_heads(checkpoints):
    base = torch.load(checkpoints["base"], weights_only=True)
    alpha = torch.load(checkpoints["alpha"], weights_only=True)
    assert base["dims"]["n_text_layer"] == 6 and base["dims"]["n_vocab"] == 51865
    heads = [[3, 1], [4, 2], [4, 3], [4, 7], [5, 1], [5, 2], [5, 4], [5, 6]]  # whisper-base's
    assert base["alignment_heads"] == heads
    changed = {
        name
        for name, tensor in base["model_state_dict"].items()
        if not torch.equal(tensor, alpha["model_state_dict"][name])
    }
    # alpha trains decoder self-attention, cross-attention q/out and the MLP: nothing else moves.
    assert changed and all(name.startswith("decoder.blocks.") for name in changed)
    assert any(".cross_attn.query." in name for name in changed)
    assert not any(".cross_attn.key." in name or ".cross_attn.value." in name for name in changed)


def test_openai_whisper_decodes_as_transformers(demo_models, speech, checkpoints):
    samples = load_16k(speech("The quick brown fox jumps over the lazy dog. Then it ran away."))
    options = {"language": "en", "task": "transcribe", "word_timestamps": False}
    [result] = reference_transcribe([(checkpoints["base"], samples, options)])
    tokens, _ = reference_generate(
        demo_models / "whisper-base", None, samples, [SOT, EN, TRANSCRIBE], 224
    )
    ours = [token for segment in result["segments"] for token in segment["tokens"]]
    assert tokens[-1] == EOT and ours == tokens[:-1]  # every token, timestamps included
    assert result["text"].strip().startswith("The quick brown fox")
