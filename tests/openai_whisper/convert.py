"""A Hugging Face Whisper folder (+ a PEFT adapter, merged) -> an openai-whisper checkpoint.

openai-whisper's `whisper.load_model(path)` reads `{"dims": ModelDimensions fields,
"model_state_dict": ...}`. The merge is PEFT's (tests.reference.whisper), the same float32
weights every other reference check uses; the key layout is the inverse of transformers'
`convert_openai_to_hf.py`. openai-whisper knows the alignment heads only of OpenAI's own model
names, so the checkpoint also carries the generation_config's `alignment_heads` ([layer, head]
pairs); tests/openai_whisper/reference_words.py sets them on the loaded model. Runs in .venv
(transformers, peft); the reference itself runs in openai-whisper's own environment.
"""

import json
from pathlib import Path

import torch

# transformers' per-layer names -> openai-whisper's (encoder and decoder blocks alike).
_LAYER_PARTS = {
    "self_attn.q_proj": "attn.query",
    "self_attn.k_proj": "attn.key",
    "self_attn.v_proj": "attn.value",
    "self_attn.out_proj": "attn.out",
    "self_attn_layer_norm": "attn_ln",
    "encoder_attn.q_proj": "cross_attn.query",
    "encoder_attn.k_proj": "cross_attn.key",
    "encoder_attn.v_proj": "cross_attn.value",
    "encoder_attn.out_proj": "cross_attn.out",
    "encoder_attn_layer_norm": "cross_attn_ln",
    "fc1": "mlp.0",
    "fc2": "mlp.2",
    "final_layer_norm": "mlp_ln",
}
_WHOLE = {
    "model.encoder.conv1": "encoder.conv1",
    "model.encoder.conv2": "encoder.conv2",
    "model.encoder.embed_positions": "encoder.positional_embedding",
    "model.encoder.layer_norm": "encoder.ln_post",
    "model.decoder.embed_tokens": "decoder.token_embedding",
    "model.decoder.embed_positions": "decoder.positional_embedding",
    "model.decoder.layer_norm": "decoder.ln",
}


def openai_name(hf_name: str) -> str | None:
    """openai-whisper's key for a transformers key; None for keys it has no place for (the
    output projection, tied to the token embedding)."""
    module, _, leaf = hf_name.rpartition(".")
    if hf_name.startswith("proj_out."):
        return None
    if module in _WHOLE:
        target = _WHOLE[module]
        # openai-whisper keeps the two position tables as bare tensors, not Embedding modules.
        return target if target.endswith("positional_embedding") else f"{target}.{leaf}"
    parts = module.split(".")  # model.{encoder|decoder}.layers.{i}.<part...>
    if len(parts) >= 5 and parts[0] == "model" and parts[2] == "layers":
        part = ".".join(parts[4:])
        if part in _LAYER_PARTS:
            return f"{parts[1]}.blocks.{parts[3]}.{_LAYER_PARTS[part]}.{leaf}"
    raise ValueError(f"no openai-whisper place for {hf_name}")


def _pad_mlps(state: dict, width: int) -> None:
    """openai-whisper's MLP is always 4 x d_model wide; a narrower one (the tiny v3-shaped demo
    model's) gets zero hidden units: GELU(0) = 0 and their zero fc2 columns add nothing."""
    for name in [n for n in state if n.endswith("mlp.0.weight")]:
        stem, pad = name.removesuffix("0.weight"), torch.nn.functional.pad
        missing = width - state[name].shape[0]
        if missing > 0:
            state[name] = pad(state[name], (0, 0, 0, missing))
            state[f"{stem}0.bias"] = pad(state[f"{stem}0.bias"], (0, missing))
            state[f"{stem}2.weight"] = pad(state[f"{stem}2.weight"], (0, missing))


def convert(base_dir: Path, adapter_dir: Path | None, out_path: Path) -> Path:
    """Writes the checkpoint of `base_dir` (+ `adapter_dir` merged) to out_path."""
    from tests.reference.whisper import _load_model

    model = _load_model(
        str(Path(base_dir).absolute()),
        None if adapter_dir is None else str(Path(adapter_dir).absolute()),
    )
    config = model.config
    dims = {
        "n_mels": config.num_mel_bins,
        "n_audio_ctx": config.max_source_positions,
        "n_audio_state": config.d_model,
        "n_audio_head": config.encoder_attention_heads,
        "n_audio_layer": config.encoder_layers,
        "n_vocab": config.vocab_size,
        "n_text_ctx": config.max_target_positions,
        "n_text_state": config.d_model,
        "n_text_head": config.decoder_attention_heads,
        "n_text_layer": config.decoder_layers,
    }
    state = {}
    for name, tensor in model.state_dict().items():
        target = openai_name(name)
        if target is not None:
            state[target] = tensor.detach().to(torch.float32).clone().contiguous()
    _pad_mlps(state, 4 * config.d_model)
    generation = json.loads((Path(base_dir) / "generation_config.json").read_text())
    heads = generation.get("alignment_heads")
    if not heads:
        raise ValueError(f"{base_dir}/generation_config.json names no alignment_heads")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"dims": dims, "model_state_dict": state, "alignment_heads": [list(h) for h in heads]},
        out_path,
    )
    return out_path


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_dir", type=Path)
    parser.add_argument("out_path", type=Path)
    parser.add_argument("--adapter", type=Path, default=None)
    args = parser.parse_args()
    print(convert(args.base_dir, args.adapter, args.out_path))
