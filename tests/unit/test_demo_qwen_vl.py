"""Tiny Qwen-VL demo models: rebuilt Qwen2 tokenizer, chat template, configs and demo adapters."""

import json
import re
import unicodedata

import numpy as np
import pytest
import tiktoken
import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from lora_tools.demo.qwen_vl import (
    QWEN2_SPLIT_PATTERN,
    SPECIAL_TOKEN_IDS,
    build_qwen_tokenizer,
    build_qwen_vl_model,
    load_qwen_bpe_ranks,
    make_qwen_vl_adapters,
)

VARIANTS = ("qwen2_vl", "qwen2_5_vl")
SAMPLE_TEXTS = [
    "Hello world! It's a test, isn't it? They'll say we'd've done it.",
    "The quick brown fox jumps over the lazy dog 1234567890 times.",
    "def f(x):\n    return x**2  # square\n\n\n\tindented\r\nwindows line",
    "   leading and trailing spaces   \n\n  ",
    "naïve café, Zürich, 東京, 中文测试, emoji 🙂👍🏽 and math ∑∫√",
    "URLs: https://example.com/a?b=c&d=e#frag, e-mail a.b@c.de, $3.50, 50%",
    "MIXED case WORDS, O'Neil's DON'T, snake_case_name, camelCaseName",
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("qwen_tokenizer")
    build_qwen_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="module")
def tiktoken_encoding():
    return tiktoken.Encoding(
        "qwen2",
        pat_str=QWEN2_SPLIT_PATTERN,
        mergeable_ranks=load_qwen_bpe_ranks(),
        special_tokens=SPECIAL_TOKEN_IDS,
    )


@pytest.fixture(scope="module", params=VARIANTS)
def model_dir(request, tmp_path_factory):
    return build_qwen_vl_model(tmp_path_factory.mktemp(request.param) / "model", request.param)


@pytest.mark.parametrize("text", SAMPLE_TEXTS)
def test_encoding_matches_tiktoken_and_round_trips(tokenizer, tiktoken_encoding, text):
    text = unicodedata.normalize("NFC", text)  # the HF tokenizer NFC-normalizes, tiktoken not
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    assert token_ids == tiktoken_encoding.encode_ordinary(text)
    assert tokenizer.decode(token_ids) == text


def test_one_merge_per_bpe_token_as_upstream(tokenizer_dir):
    lines = (tokenizer_dir / "merges.txt").read_text().splitlines()
    assert lines[0].startswith("#version")
    assert len(lines) - 1 == 151643 - 256
    vocab = json.loads((tokenizer_dir / "vocab.json").read_text())
    assert len(vocab) == 151643
    left, right = lines[1].split(" ")
    assert left + right in vocab


def test_special_token_ids(tokenizer):
    assert len(tokenizer) == 151657
    for token, token_id in SPECIAL_TOKEN_IDS.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id
    assert SPECIAL_TOKEN_IDS["<|vision_start|>"] == 151652
    assert SPECIAL_TOKEN_IDS["<|image_pad|>"] == 151655
    assert SPECIAL_TOKEN_IDS["<|video_pad|>"] == 151656
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 151645)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 151643)
    assert tokenizer.bos_token is None
    ids = tokenizer.encode("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi")
    assert ids[:1] == [151644] and ids[3:6] == [151652, 151655, 151653]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_chat_template_places_media_and_default_system_prompt(tokenizer):
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "image"},
                {"type": "video"},
                {"type": "text", "text": "Compare them."},
            ],
        }
    ]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n"
        "<|vision_start|><|image_pad|><|vision_end|>"
        "<|vision_start|><|image_pad|><|vision_end|>"
        "<|vision_start|><|video_pad|><|vision_end|>"
        "Compare them.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    own_system = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(own_system, tokenize=False) == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_model_config_and_processor(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    text = config["text_config"]
    assert config["image_token_id"] == 151655 and config["video_token_id"] == 151656
    assert config["vision_start_token_id"] == 151652
    assert text["vocab_size"] == 151936
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    assert head_dim in (32, 64, 80)  # head sizes vLLM's CPU attention accepts
    assert sum(text["rope_parameters"]["mrope_section"]) == head_dim // 2

    processor = AutoProcessor.from_pretrained(model_dir)
    expected = "Qwen2VLProcessor" if config["model_type"] == "qwen2_vl" else "Qwen2_5_VLProcessor"
    assert type(processor).__name__ == expected
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}],
        add_generation_prompt=True,
    )
    image = Image.fromarray(np.zeros((448, 448, 3), dtype=np.uint8))
    inputs = processor(text=[prompt], images=[image], return_tensors="pt")
    assert (inputs["input_ids"] == 151655).sum() == 64  # max_pixels caps the image at 224 x 224


def test_build_is_idempotent(model_dir):
    weights = model_dir / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    variant = json.loads((model_dir / "config.json").read_text())["model_type"]
    assert build_qwen_vl_model(model_dir, variant) == model_dir
    assert weights.stat().st_mtime_ns == mtime


def test_adapters_are_deterministic_distinct_and_nonzero(model_dir, tmp_path):
    first = make_qwen_vl_adapters(model_dir, tmp_path / "first")
    again = make_qwen_vl_adapters(model_dir, tmp_path / "again")
    other_seed = make_qwen_vl_adapters(model_dir, tmp_path / "other", names=("alpha",), seed=1)
    alpha, beta = (load_file(path / "adapter_model.safetensors") for path in first)
    for path in first:
        assert sorted(p.name for p in path.iterdir()) == [
            "adapter_config.json",
            "adapter_model.safetensors",
        ]
    for directory, repeat in zip(first, again, strict=True):
        original = load_file(directory / "adapter_model.safetensors")
        repeated = load_file(repeat / "adapter_model.safetensors")
        assert all(torch.equal(original[key], repeated[key]) for key in original)
    reseeded = load_file(other_seed[0] / "adapter_model.safetensors")
    for key in alpha:
        assert not torch.equal(alpha[key], beta[key])
        assert not torch.equal(alpha[key], reseeded[key])
        if key.endswith("lora_B.weight"):
            assert alpha[key].abs().min() > 0 and alpha[key].std() > 0.1


def test_adapters_cover_language_model_tower_and_merger(model_dir, tmp_path):
    (adapter_dir,) = make_qwen_vl_adapters(model_dir, tmp_path, names=("alpha",))
    module_names = {
        key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
        for key in load_file(adapter_dir / "adapter_model.safetensors")
        if key.endswith("lora_A.weight")
    }
    suffixes = {re.sub(r"^.*\.(layers|blocks)\.\d+\.", "", name) for name in module_names}
    language = {f"self_attn.{p}_proj" for p in "qkvo"} | {
        f"mlp.{p}_proj" for p in ("gate", "up", "down")
    }
    is_qwen2_vl = json.loads((model_dir / "config.json").read_text())["model_type"] == "qwen2_vl"
    vision_mlp = ("fc1", "fc2") if is_qwen2_vl else ("gate_proj", "up_proj", "down_proj")
    vision = {"attn.qkv", "attn.proj"} | {f"mlp.{name}" for name in vision_mlp}
    merger = {"model.visual.merger.mlp.0", "model.visual.merger.mlp.2"}
    assert suffixes == language | vision | merger
    assert len(module_names) == 2 * len(language) + 2 * len(vision) + len(merger)

    # PEFT itself must find every module the adapter names and load its weights.
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    peft_model = PeftModel.from_pretrained(model, adapter_dir)
    lora_layers = {
        name.removeprefix("base_model.model."): module
        for name, module in peft_model.named_modules()
        if isinstance(module, LoraLayer)
    }
    assert set(lora_layers) == module_names
    saved = load_file(adapter_dir / "adapter_model.safetensors")
    some_name = sorted(module_names)[0]
    loaded_b = lora_layers[some_name].lora_B["default"].weight
    assert torch.equal(loaded_b, saved[f"base_model.model.{some_name}.lora_B.weight"])


def test_streamed_text_holds_back_a_token_that_ends_inside_a_character(tokenizer):
    from tests.reference.qwen_vl import streamed_text

    theta = tokenizer.encode(" theta", add_special_tokens=False)
    # Token 143887 is "久し" plus the first bytes of a third character (seen as the 16th
    # greedy token of a fleet test's adapter): vLLM never sends its text.
    assert tokenizer.decode([143887]).startswith("久し")
    assert tokenizer.decode([143887]).endswith("\ufffd")
    assert streamed_text(tokenizer, [*theta, 143887]) == " theta"
    # Completed by the next token, the character and everything before it are sent.
    complete = tokenizer.encode(" theta 久しぶり", add_special_tokens=False)
    assert streamed_text(tokenizer, complete) == " theta 久しぶり"
