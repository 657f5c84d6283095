"""CTranslate2 reader, CT2 -> transformers name mapping and demo adapters, on tiny models."""

import json
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import WhisperConfig, WhisperForConditionalGeneration

from lora_tools.demo.whisper import (
    ADAPTER_RELATIVE_STRENGTH,
    WhisperTokenIds,
    make_whisper_adapters,
    parse_ct2_model,
    read_installed_whisper_base,
    whisper_config_dict,
    whisper_generation_config_dict,
    whisper_state_dict_from_ct2,
    with_timestamp_tokens,
)

DTYPE_IDS = {np.dtype("<f4"): 0, np.dtype("i1"): 1, np.dtype("<i2"): 2, np.dtype("<f2"): 4}
D_MODEL, FFN, VOCAB, MELS, SOURCE_POSITIONS, TARGET_POSITIONS = 8, 16, 12, 4, 6, 5


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def ct2_bytes(
    variables: dict[str, np.ndarray],
    aliases: dict[str, str],
    *,
    version: int = 6,
    dtype_ids: dict[np.dtype, int] = DTYPE_IDS,
) -> bytes:
    """An independent writer of CTranslate2's model.bin layout (as ModelSpec._serialize)."""
    out = [struct.pack("<I", version), _string("WhisperSpec"), struct.pack("<I", 3)]
    out.append(struct.pack("<I", len(variables)))
    for name, value in variables.items():
        out += [_string(name), struct.pack("<B", value.ndim)]
        out += [struct.pack("<I", dim) for dim in value.shape]
        out += [struct.pack("<B", dtype_ids[value.dtype]), struct.pack("<I", value.nbytes)]
        out.append(value.tobytes())
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        out += [_string(alias), _string(target)]
    return b"".join(out)


def tiny_ct2_whisper(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """CTranslate2 variable names of a 1+1-layer Whisper with distinct random float16 values."""
    shapes = {
        "encoder/conv1/weight": (D_MODEL, MELS, 3),
        "encoder/conv1/bias": (D_MODEL,),
        "encoder/conv2/weight": (D_MODEL, D_MODEL, 3),
        "encoder/conv2/bias": (D_MODEL,),
        "encoder/position_encodings/encodings": (SOURCE_POSITIONS, D_MODEL),
        "decoder/embeddings/weight": (VOCAB, D_MODEL),
        "decoder/position_encodings/encodings": (TARGET_POSITIONS, D_MODEL),
    }
    for stack in ("encoder", "decoder"):
        layer = f"{stack}/layer_0"
        attentions = {"self_attention": [3 * D_MODEL, D_MODEL]}
        if stack == "decoder":
            attentions["attention"] = [D_MODEL, 2 * D_MODEL, D_MODEL]
        for attention, out_sizes in attentions.items():
            for i, out_size in enumerate(out_sizes):
                shapes[f"{layer}/{attention}/linear_{i}/weight"] = (out_size, D_MODEL)
                shapes[f"{layer}/{attention}/linear_{i}/bias"] = (out_size,)
        shapes[f"{layer}/ffn/linear_0/weight"] = (FFN, D_MODEL)
        shapes[f"{layer}/ffn/linear_0/bias"] = (FFN,)
        shapes[f"{layer}/ffn/linear_1/weight"] = (D_MODEL, FFN)
        shapes[f"{layer}/ffn/linear_1/bias"] = (D_MODEL,)
        norms = ["self_attention", "ffn"] + (["attention"] if stack == "decoder" else [])
        for norm in [f"{layer}/{name}/layer_norm" for name in norms] + [f"{stack}/layer_norm"]:
            shapes[f"{norm}/gamma"] = (D_MODEL,)
            shapes[f"{norm}/beta"] = (D_MODEL,)
    variables = {
        name: rng.standard_normal(shape).astype(np.float16) for name, shape in shapes.items()
    }
    variables["encoder/num_heads"] = np.array(2, dtype=np.int16)
    variables["decoder/num_heads"] = np.array(2, dtype=np.int16)
    variables["decoder/pre_norm"] = np.array(1, dtype=np.int8)
    return variables


TOKEN_IDS = WhisperTokenIds(
    end_of_text=7,
    start_of_transcript=8,
    start_of_prev=9,
    no_timestamps=11,
    translate=5,
    transcribe=6,
)
CT2_CONFIG = {
    "alignment_heads": [[0, 1]],
    "lang_ids": [3, 4],
    "suppress_ids": [1, 2],
    "suppress_ids_begin": [0, 7],
}


def test_parser_reads_back_variables_scalars_and_aliases():
    variables = {
        "a/weight": np.arange(6, dtype=np.float16).reshape(2, 3),
        "a/scale": np.array([1.5, -2.0], dtype=np.float32),
        "num_heads": np.array(8, dtype=np.int16),
        "flag": np.array(1, dtype=np.int8),
    }
    model = parse_ct2_model(ct2_bytes(variables, {"b/weight": "a/weight"}))

    assert (model.spec_name, model.revision) == ("WhisperSpec", 3)
    assert model.aliases == {"b/weight": "a/weight"}
    assert list(model.variables) == list(variables)
    for name, expected in variables.items():
        assert model.variables[name].dtype == expected.dtype
        np.testing.assert_array_equal(model.variables[name], expected)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (ct2_bytes({"x": np.zeros(2, np.float32)}, {}, version=5), "binary version 5"),
        (
            ct2_bytes({"x": np.zeros(2, np.float32)}, {}, dtype_ids={np.dtype("<f4"): 5}),
            "'x' has unsupported CTranslate2 dtype id 5",
        ),
        (ct2_bytes({"x": np.zeros(2, np.float32)}, {}) + b"\0", "1 trailing bytes"),
    ],
    ids=["version", "dtype", "trailing-bytes"],
)
def test_parser_rejects_what_it_cannot_read(data, message):
    with pytest.raises(ValueError, match=message):
        parse_ct2_model(data)


@pytest.fixture(scope="module")
def tiny_ct2():
    variables = tiny_ct2_whisper(np.random.default_rng(0))
    aliases = {"decoder/projection/weight": "decoder/embeddings/weight"}
    return parse_ct2_model(ct2_bytes(variables, aliases))


def test_state_dict_loads_strictly_into_transformers_whisper(tiny_ct2):
    config = WhisperConfig(**whisper_config_dict(tiny_ct2.variables, TOKEN_IDS, CT2_CONFIG))
    model = WhisperForConditionalGeneration(config)
    state = whisper_state_dict_from_ct2(tiny_ct2)

    model.load_state_dict({name: torch.from_numpy(v) for name, v in state.items()}, strict=True)
    assert (config.encoder_layers, config.decoder_layers) == (1, 1)
    assert (config.d_model, config.encoder_ffn_dim, config.vocab_size) == (D_MODEL, FFN, VOCAB)
    assert (config.num_mel_bins, config.encoder_attention_heads) == (MELS, 2)
    assert (config.max_source_positions, config.max_target_positions) == (6, 5)
    assert config.decoder_start_token_id == TOKEN_IDS.start_of_transcript


def test_fused_projections_are_split_in_order_and_key_biases_dropped(tiny_ct2):
    ct2 = {name: np.asarray(v, np.float32) for name, v in tiny_ct2.variables.items()}
    state = whisper_state_dict_from_ct2(tiny_ct2)
    self_qkv = ct2["decoder/layer_0/self_attention/linear_0/weight"]
    self_bias = ct2["decoder/layer_0/self_attention/linear_0/bias"]
    cross_kv = ct2["decoder/layer_0/attention/linear_1/weight"]
    layer = "model.decoder.layers.0"
    d = D_MODEL

    np.testing.assert_array_equal(state[f"{layer}.self_attn.q_proj.weight"], self_qkv[:d])
    np.testing.assert_array_equal(state[f"{layer}.self_attn.k_proj.weight"], self_qkv[d : 2 * d])
    np.testing.assert_array_equal(state[f"{layer}.self_attn.v_proj.weight"], self_qkv[2 * d :])
    np.testing.assert_array_equal(state[f"{layer}.self_attn.v_proj.bias"], self_bias[2 * d :])
    np.testing.assert_array_equal(state[f"{layer}.encoder_attn.k_proj.weight"], cross_kv[:d])
    np.testing.assert_array_equal(state[f"{layer}.encoder_attn.v_proj.weight"], cross_kv[d:])
    np.testing.assert_array_equal(
        state[f"{layer}.encoder_attn.out_proj.weight"],
        ct2["decoder/layer_0/attention/linear_2/weight"],
    )
    np.testing.assert_array_equal(state["proj_out.weight"], ct2["decoder/embeddings/weight"])
    assert not [name for name in state if name.endswith("k_proj.bias")]
    assert all(value.dtype == np.float32 for value in state.values())


def test_timestamp_tokens_follow_the_last_special_token():
    tokenizer_json = {"added_tokens": [{"id": 2, "content": "<|notimestamps|>", "special": True}]}
    vocabulary = ["a", "b", "<|notimestamps|>", "<|0.00|>", "<|0.02|>"]

    added = with_timestamp_tokens(tokenizer_json, vocabulary)["added_tokens"]

    assert [(t["id"], t["content"], t["special"]) for t in added[1:]] == [
        (3, "<|0.00|>", False),
        (4, "<|0.02|>", False),
    ]
    assert len(tokenizer_json["added_tokens"]) == 1


def test_generation_config_names_language_and_task_tokens():
    tokenizer_json = {
        "added_tokens": [{"id": 3, "content": "<|en|>"}, {"id": 4, "content": "<|de|>"}]
    }
    config = whisper_generation_config_dict(tokenizer_json, TOKEN_IDS, CT2_CONFIG, max_length=5)

    assert config["lang_to_id"] == {"<|en|>": 3, "<|de|>": 4}
    assert config["task_to_id"] == {"translate": 5, "transcribe": 6}
    assert config["forced_decoder_ids"] == [[1, None], [2, 6]]
    assert (config["decoder_start_token_id"], config["no_timestamps_token_id"]) == (8, 11)
    assert (config["suppress_tokens"], config["begin_suppress_tokens"]) == ([1, 2], [0, 7])


def test_installed_whisper_base_parses_as_expected():
    model_bin, ct2_dir = read_installed_whisper_base()
    model = parse_ct2_model(model_bin)

    assert model.spec_name == "WhisperSpec"
    assert model.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    assert model.variables["decoder/embeddings/weight"].shape == (51865, 512)
    assert json.loads((ct2_dir / "config.json").read_text())["lang_ids"][0] == 50259


@pytest.fixture(scope="module")
def tiny_base_dir(tmp_path_factory):
    config = WhisperConfig(
        vocab_size=64,
        d_model=16,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_mel_bins=8,
        max_source_positions=10,
        max_target_positions=12,
        pad_token_id=1,
        bos_token_id=1,
        eos_token_id=1,
        decoder_start_token_id=2,
        begin_suppress_tokens=None,
    )
    torch.manual_seed(0)
    base_dir = tmp_path_factory.mktemp("tiny-whisper")
    WhisperForConditionalGeneration(config).save_pretrained(base_dir)
    return base_dir


def _adapter_tensors(adapter_dir):
    return load_file(adapter_dir / "adapter_model.safetensors")


def test_adapters_are_deterministic_and_distinct(tiny_base_dir, tmp_path):
    first = make_whisper_adapters(tiny_base_dir, tmp_path / "one", names=("alpha", "beta"))
    again = make_whisper_adapters(tiny_base_dir, tmp_path / "two", names=("beta", "alpha"))
    reseeded = make_whisper_adapters(tiny_base_dir, tmp_path / "three", names=("alpha",), seed=1)

    alpha, beta = (_adapter_tensors(d) for d in first)
    beta_again, alpha_again = (_adapter_tensors(d) for d in again)
    alpha_reseeded = _adapter_tensors(reseeded[0])
    assert [d.name for d in first] == ["alpha", "beta"]
    for name in alpha:
        assert torch.equal(alpha[name], alpha_again[name])
        assert torch.equal(beta[name], beta_again[name])
        assert not torch.equal(alpha[name], beta[name])
        assert not torch.equal(alpha[name], alpha_reseeded[name])


def test_adapters_target_decoder_modules_only_with_nonzero_deltas(tiny_base_dir, tmp_path):
    (adapter_dir,) = make_whisper_adapters(tiny_base_dir, tmp_path, names=("alpha",), rank=4)
    tensors = _adapter_tensors(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    base = load_file(tiny_base_dir / "model.safetensors")

    modules = {name.rsplit(".", 2)[0].removeprefix("base_model.model.") for name in tensors}
    assert modules == {
        f"model.decoder.layers.{i}.{module}"
        for i in range(2)
        for module in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.out_proj",
            "encoder_attn.q_proj",
            "encoder_attn.out_proj",
            "fc1",
            "fc2",
        )
    }
    assert (config["r"], config["lora_alpha"]) == (4, 8)
    assert config["base_model_name_or_path"] == str(tiny_base_dir)
    assert sorted(p.name for p in adapter_dir.glob("adapter_model.*")) == [
        "adapter_model.safetensors"
    ]
    for module in modules:
        lora_a = tensors[f"base_model.model.{module}.lora_A.weight"]
        lora_b = tensors[f"base_model.model.{module}.lora_B.weight"]
        delta = (config["lora_alpha"] / config["r"]) * lora_b @ lora_a
        relative = delta.norm() / base[f"{module}.weight"].norm()
        assert relative.item() == pytest.approx(ADAPTER_RELATIVE_STRENGTH, rel=1e-4)


def test_tiny_en_is_converted_as_an_english_only_model(demo_models):
    """generation_config as upstream's openai/whisper-tiny.en: no language or task tables, the
    prompt forced to <|notimestamps|>, the alignment heads openai-whisper lists for tiny.en."""
    folder = demo_models / "whisper-tiny.en"
    config = json.loads((folder / "config.json").read_text())
    generation = json.loads((folder / "generation_config.json").read_text())
    assert (config["vocab_size"], config["d_model"], config["decoder_layers"]) == (51_864, 384, 4)
    assert generation["is_multilingual"] is False
    assert "lang_to_id" not in generation and "task_to_id" not in generation
    assert generation["forced_decoder_ids"] == [[1, 50362]]
    assert generation["alignment_heads"] == [
        [1, 0],
        [2, 0],
        [2, 5],
        [3, 0],
        [3, 1],
        [3, 2],
        [3, 3],
        [3, 4],
    ]


def test_v3_shape_has_large_v3s_layout(demo_models):
    from lora_tools.demo.whisper_v3_shape import v3_tokenizer_json

    folder = demo_models / "whisper-v3-shape"
    config = json.loads((folder / "config.json").read_text())
    generation = json.loads((folder / "generation_config.json").read_text())
    features = json.loads((folder / "preprocessor_config.json").read_text())
    assert (config["vocab_size"], config["num_mel_bins"], features["feature_size"]) == (
        51_866,
        128,
        128,
    )
    assert len(generation["lang_to_id"]) == 100 and generation["lang_to_id"]["<|yue|>"] == 50_358
    assert generation["task_to_id"] == {"translate": 50_359, "transcribe": 50_360}
    base = json.loads((demo_models / "whisper-base" / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in v3_tokenizer_json(base)["added_tokens"]}
    assert (ids["<|su|>"], ids["<|yue|>"], ids["<|nospeech|>"], ids["<|30.00|>"]) == (
        50_357,
        50_358,
        50_363,
        51_865,
    )
