"""Tiny Qwen3-VL demo model: Qwen3 tokenizer and chat template, config, adapters per module kind."""

import json
import re

import pytest
import tiktoken
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoProcessor, AutoTokenizer

from lora_tools.demo import qwen3_vl
from lora_tools.demo.qwen_vl import QWEN2_SPLIT_PATTERN, load_qwen_bpe_ranks, video_metadata

TEXTS = [
    "Hello world! It's a test, isn't it? 1234567890",
    "naïve café, 東京, 中文测试, emoji 🙂👍🏽\n\n\tindented",
    "<think>\nreasoning\n</think>\n\n<tool_call>{}</tool_call>",
]


@pytest.fixture(scope="module")
def model_dir(demo_models):
    return demo_models / "qwen3-vl-tiny"


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


def test_added_token_ids_and_flags_as_qwen3(model_dir, tokenizer):
    decoder = json.loads((model_dir / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    assert {int(i): (t["content"], t["special"]) for i, t in decoder.items()} == {
        151643 + i: added for i, added in enumerate(qwen3_vl.ADDED_TOKENS)
    }
    assert [tokenizer.convert_tokens_to_ids(t) for t in ("<think>", "</think>")] == [
        151667,
        151668,
    ]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


@pytest.mark.parametrize("text", TEXTS)
def test_encoding_matches_tiktoken_with_qwen3_added_tokens(tokenizer, text):
    encoding = tiktoken.Encoding(
        "qwen3",
        pat_str=QWEN2_SPLIT_PATTERN,
        mergeable_ranks=load_qwen_bpe_ranks(),
        special_tokens=qwen3_vl.TOKEN_IDS,
    )
    expected = encoding.encode(text, allowed_special="all")
    assert tokenizer.encode(text) == expected
    assert tokenizer.decode(expected) == text


def test_chat_template_is_upstreams_and_renders_media_as_the_processor_expands_them(model_dir):
    assert (model_dir / "chat_template.jinja").read_text() == qwen3_vl.chat_template()
    processor = AutoProcessor.from_pretrained(model_dir)
    messages = [
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "Hi"}],
        }
    ]
    prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # Qwen3-VL-Instruct: no default system prompt, no <think> after the assistant header.
    assert prompt == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
        "<|vision_start|><|video_pad|><|vision_end|>Hi<|im_end|>\n<|im_start|>assistant\n"
    )
    frames = [Image.new("RGB", (64, 64), (40 * i, 0, 0)) for i in range(4)]
    inputs = processor(
        text=[prompt],
        images=[Image.new("RGB", (96, 64))],
        videos=[frames],
        video_metadata=[video_metadata(4, 2.0)],
        do_sample_frames=False,
    )
    text = processor.tokenizer.decode(inputs["input_ids"][0])
    # 16-pixel patches merged 2 x 2: a 96 x 64 image is 3 x 2 tokens; each pair of 64 x 64
    # frames is 2 x 2 tokens, preceded by its time in seconds (Qwen3-VL's text timestamps).
    assert text.count("<|image_pad|>") == 6
    assert re.findall(r"<([\d.]+) seconds><\|vision_start\|>", text) == ["0.2", "1.2"]
    assert text.count("<|video_pad|>") == 8


def test_config_has_deepstack_mergers_and_cpu_attention_shapes(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3VLForConditionalGeneration"]
    text, vision = config["text_config"], config["vision_config"]
    assert text["head_dim"] == 64 and vision["hidden_size"] // vision["num_heads"] == 32
    assert vision["deepstack_visual_indexes"] == qwen3_vl.DEEPSTACK_VISUAL_INDEXES


@pytest.mark.parametrize("name", list(qwen3_vl.ADAPTER_PATTERNS))
def test_each_adapter_covers_exactly_its_module_kinds(demo_models, name):
    tensors = load_file(demo_models / "qwen3-vl-adapters" / name / "adapter_model.safetensors")
    modules = {key.split(".lora_")[0].removeprefix("base_model.model.") for key in tensors}
    kinds = {
        kind
        for kind, pattern in qwen3_vl.LORA_PATTERNS.items()
        if any(re.fullmatch(pattern, module) for module in modules)
    }
    expected = set(qwen3_vl.LORA_PATTERNS) if name in ("alpha", "beta") else {name}
    assert kinds == expected
    if "deepstack" in expected:
        assert {m for m in modules if "deepstack" in m} == {
            f"model.visual.deepstack_merger_list.{i}.linear_fc{n}" for i in (0, 1) for n in (1, 2)
        }
