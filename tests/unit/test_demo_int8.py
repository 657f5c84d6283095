"""lora_tools.demo.int8: a W8A8 copy of a checkpoint, in the format vLLM reads."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from lora_tools.demo import int8


def test_rows_are_quantized_symmetrically_with_one_scale_each():
    weight = torch.tensor([[0.5, -1.0, 0.25], [3.0, 0.0, -1.5]])
    quantized, scale = int8.quantize_rows(weight)
    assert quantized.dtype == torch.int8 and scale.shape == (2, 1)
    assert quantized.tolist() == [[64, -127, 32], [127, 0, -64]]
    assert torch.allclose(scale.squeeze(1), torch.tensor([1.0, 3.0]) / 127)
    # Every weight is within half a step of its int8 value.
    assert ((quantized.float() * scale - weight).abs() <= scale / 2 + 1e-7).all()


def write_checkpoint(folder):
    folder.mkdir()
    tensors = {
        "model.encoder.layers.0.self_attn.q_proj.weight": torch.randn(8, 4),
        "model.encoder.layers.0.self_attn.q_proj.bias": torch.randn(8),
        "model.decoder.layers.1.encoder_attn.k_proj.weight": torch.randn(8, 4),
        "model.decoder.layers.1.fc2.weight": torch.randn(4, 8),
        "model.encoder.conv1.weight": torch.randn(8, 4, 3),
        "model.decoder.embed_tokens.weight": torch.randn(16, 4),
        "model.encoder.layer_norm.weight": torch.randn(4),
    }
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    (folder / "tokenizer.json").write_text("{}")
    return tensors


def test_checkpoint_gets_int8_linear_layers_and_a_compressed_tensors_config(tmp_path):
    tensors = write_checkpoint(tmp_path / "float")
    out = int8.quantize_checkpoint(tmp_path / "float", tmp_path / "int8")
    written = load_file(out / "model.safetensors")
    linear = (
        "model.encoder.layers.0.self_attn.q_proj.weight",
        "model.decoder.layers.1.encoder_attn.k_proj.weight",
        "model.decoder.layers.1.fc2.weight",
    )
    for name in linear:
        assert written[name].dtype == torch.int8
        scale = written[name.removesuffix("weight") + "weight_scale"]
        assert scale.shape == (tensors[name].shape[0], 1)
        assert torch.allclose(written[name].float() * scale, tensors[name], atol=scale.max())
    for name in set(tensors) - set(linear):  # biases, convolutions, embeddings, norms
        assert torch.equal(written[name], tensors[name])
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "whisper"
    group = config["quantization_config"]["config_groups"]["group_0"]
    assert group["weights"]["strategy"] == "channel" and not group["weights"]["dynamic"]
    assert group["input_activations"] == {
        "num_bits": 8,
        "type": "int",
        "symmetric": True,
        "strategy": "token",
        "dynamic": True,
    }
    assert config["quantization_config"]["ignore"] == ["proj_out"]
    assert (out / "tokenizer.json").read_text() == "{}"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["float", "int8"]  # no staging
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o644  # others read it too
    # Done once: a second call keeps the folder as it is.
    before = (out / "model.safetensors").stat().st_mtime_ns
    assert int8.quantize_checkpoint(tmp_path / "float", tmp_path / "int8") == out
    assert (out / "model.safetensors").stat().st_mtime_ns == before


def test_refuses_a_checkpoint_with_nothing_to_quantize_and_a_half_written_folder(tmp_path):
    folder = tmp_path / "float"
    folder.mkdir()
    save_file({"embed.weight": torch.randn(4, 4)}, folder / "model.safetensors")
    (folder / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="no tensor"):
        int8.quantize_checkpoint(folder, tmp_path / "int8")
    assert [path.name for path in tmp_path.iterdir()] == ["float"]  # nor a staging folder
    (tmp_path / "half").mkdir()
    with pytest.raises(FileExistsError, match="not a complete model"):
        int8.quantize_checkpoint(folder, tmp_path / "half")
