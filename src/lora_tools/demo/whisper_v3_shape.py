"""A tiny random Whisper shaped like large-v3 / large-v3-turbo, for permanent tests.

What it shares with large-v3: 128 mel bins, the 51,866-token vocabulary and its special-token
layout (openai-whisper's multilingual text ranks, then <|endoftext|>, <|startoftranscript|>, 100
languages ending in <|yue|>, the task and control tokens, 1,501 timestamps), full 30 s windows
(1,500 encoder frames) and a decoder deeper than its encoder, as turbo's 4 decoder layers. What
it does not: the size (d_model 64, one head: head_dim 64, which CPU attention takes) and trained
weights.

The tokenizer is whisper-base's (converted from its CTranslate2 package, every merge rebuilt)
with <|yue|> inserted after <|su|> and the later special tokens moved up by one;
tests/unit/test_whisper_tokenizer.py checks it token for token against openai-whisper's own
tokenizer (num_languages=100).

Language detection picks <|yue|>, deterministically: the decoder's final layer norm gets a bias
along a unit vector u, and <|yue|>'s (tied) embedding row gets YUE_BOOST * u, so every decoder
position's <|yue|> logit carries about FINAL_NORM_BIAS * YUE_BOOST (4) more than it would. A
boost large enough alone (~12) makes <|yue|> the likeliest token of the whole vocabulary at every
step, and transcripts mere <|yue|> repeats; so the boost is 4 and SEED is the first seed from 0
whose detection picks <|yue|> over the other 99 languages by at least 1.7 nats on six test
audios, while <|yue|> stays outside the whole vocabulary's top 15 (seed search, 2026-12-04).
"""

import json
import tempfile
from pathlib import Path

from lora_tools.demo.whisper import HF_MODEL_FILES, save_whisper_folder

SEED = 39
MEL_BINS = 128
VOCAB_SIZE = 51_866
# <|su|> is the 99th language (50357 in whisper-base); <|yue|> takes the next id in v3.
YUE_ID = 50_358
FINAL_NORM_BIAS, YUE_BOOST = 2.0, 2.0
ALIGNMENT_HEADS = [[2, 0], [3, 0]]
SHAPE = {
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 4,
    "encoder_attention_heads": 1,
    "decoder_attention_heads": 1,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "init_std": 0.2,  # greedy choices with clear margins
}


def v3_tokenizer_json(base_tokenizer_json: dict) -> dict:
    """whisper-base's tokenizer.json (99 languages) -> large-v3's layout (100, <|yue|> last;
    <|nocaptions|> renamed <|nospeech|>, as large-v3's tokenizer and openai-whisper name it)."""
    added = []
    for token in base_tokenizer_json["added_tokens"]:
        moved = dict(token)
        if token["content"] == "<|nocaptions|>":  # large-v3's (and openai-whisper's) name
            moved["content"] = "<|nospeech|>"
        if token["id"] >= YUE_ID:
            moved["id"] = token["id"] + 1
        added.append(moved)
        if token["content"] == "<|su|>":
            if token["id"] != YUE_ID - 1:
                raise ValueError(f"<|su|> is {token['id']}, expected {YUE_ID - 1}")
            added.append({**token, "id": YUE_ID, "content": "<|yue|>"})
    ids = sorted(token["id"] for token in added)
    if ids != list(range(ids[0], VOCAB_SIZE)):
        raise ValueError(f"the special tokens do not end a {VOCAB_SIZE}-token vocabulary")
    return {**base_tokenizer_json, "added_tokens": sorted(added, key=lambda t: t["id"])}


def _shifted(ids: list[int]) -> list[int]:
    return [i + 1 if i >= YUE_ID else i for i in ids]


def build_v3_shape(out_dir: Path, whisper_base: Path) -> Path:
    """Write the model to out_dir (skipped if already complete), its tokenizer derived from the
    converted whisper-base folder."""
    import torch
    from transformers import (
        WhisperConfig,
        WhisperForConditionalGeneration,
    )

    out_dir = Path(out_dir).absolute()
    if all((out_dir / name).is_file() for name in HF_MODEL_FILES):
        return out_dir
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists but is not a complete model; remove it first")
    base_config = json.loads((whisper_base / "config.json").read_text())
    base_generation = json.loads((whisper_base / "generation_config.json").read_text())
    tokenizer_json = v3_tokenizer_json(
        json.loads((whisper_base / "tokenizer.json").read_text(encoding="utf-8"))
    )
    ids = {token["content"]: token["id"] for token in tokenizer_json["added_tokens"]}
    suppress = _shifted(base_config["suppress_tokens"])
    config = WhisperConfig(
        vocab_size=VOCAB_SIZE,
        num_mel_bins=MEL_BINS,
        activation_function="gelu",
        scale_embedding=False,
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|endoftext|>"],
        pad_token_id=ids["<|endoftext|>"],
        decoder_start_token_id=ids["<|startoftranscript|>"],
        begin_suppress_tokens=base_config["begin_suppress_tokens"],
        suppress_tokens=suppress,
        **SHAPE,
    )
    torch.manual_seed(SEED)
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():
        generator = torch.Generator().manual_seed(SEED)
        direction = torch.randn(config.d_model, generator=generator)
        direction /= direction.norm()
        model.model.decoder.layer_norm.bias.copy_(FINAL_NORM_BIAS * direction)
        model.model.decoder.embed_tokens.weight[YUE_ID] += YUE_BOOST * direction
    first, end = ids["<|startoftranscript|>"] + 1, ids["<|translate|>"]
    languages = [t for t in tokenizer_json["added_tokens"] if first <= t["id"] < end]
    generation = {
        "alignment_heads": ALIGNMENT_HEADS,
        "begin_suppress_tokens": base_generation["begin_suppress_tokens"],
        "bos_token_id": ids["<|endoftext|>"],
        "decoder_start_token_id": ids["<|startoftranscript|>"],
        "eos_token_id": ids["<|endoftext|>"],
        "forced_decoder_ids": [[1, None], [2, ids["<|transcribe|>"]]],
        "is_multilingual": True,
        "lang_to_id": {t["content"]: t["id"] for t in languages},
        "max_initial_timestamp_index": 50,
        "max_length": SHAPE["max_target_positions"],
        "no_timestamps_token_id": ids["<|notimestamps|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "prev_sot_token_id": ids["<|startofprev|>"],
        "return_timestamps": False,
        "suppress_tokens": suppress,
        "task_to_id": {"translate": ids["<|translate|>"], "transcribe": ids["<|transcribe|>"]},
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.") as tmp:
        staging = Path(tmp) / out_dir.name
        model.save_pretrained(staging, safe_serialization=True)
        save_whisper_folder(
            staging,
            out_dir,
            generation_config=generation,
            tokenizer_json=tokenizer_json,
            num_mel_bins=MEL_BINS,
        )
    return out_dir
