"""python -m lora_tools.finetune train|evaluate: a domain adapter for whisper_lora.

train     synthesise the training corpus and write a PEFT adapter into the adapter root
          (the running server picks it up at its next rescan)
evaluate  held-out sentences through the running tritonserver: WER and domain-term recall per
          adapter next to the base model, and the base model's output on ordinary speech
"""

import argparse
import sys
from pathlib import Path

from lora_tools.finetune.corpus import build_split

DEFAULT_ROOT = Path("adapters/whisper_lora")  # serving.adapters.roots of model_repository/
DEFAULT_BASE = Path("demo_models/whisper-base")
DEFAULT_SPEECH = Path("results/finetune-speech")


def _train(args) -> int:
    from lora_tools.finetune.train import TrainSettings, train_adapter

    settings = TrainSettings(
        kind=args.kind,
        rank=args.rank,
        alpha=2 * args.rank,
        learning_rate=args.lr,
        epochs=args.epochs,
        encoder_layers=args.encoder_layers,
        seed=args.seed,
        threads=args.threads,
    )
    utterances = build_split(args.seed).train[: args.clips]
    report = train_adapter(args.base, args.root / args.name, utterances, args.speech_dir, settings)
    print(
        f"{args.name}: {report.clips} clips in {report.windows} windows, {report.steps} steps, "
        f"{report.seconds:.0f} s; mean loss first epoch {report.first_loss:.3f}, "
        f"last epoch {report.last_loss:.3f}\nwritten to {report.adapter_dir}"
    )
    return 0


def _evaluate(args) -> int:
    from lora_tools.finetune.evaluate import evaluate, format_report

    evaluation = evaluate(
        args.url, args.adapters, build_split(args.seed), args.speech_dir, limit=args.limit
    )
    print(format_report(evaluation))
    return 0 if evaluation.base_unchanged else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lora_tools.finetune", description=__doc__)
    parser.add_argument("--speech-dir", type=Path, default=DEFAULT_SPEECH, help="espeak-ng cache")
    parser.add_argument("--seed", type=int, default=0, help="corpus voices and training order")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train one adapter")
    train.add_argument("--name", required=True, help="adapter name = folder under --root")
    train.add_argument("--kind", choices=["decoder", "all_layers"], default="decoder")
    train.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    train.add_argument("--base", type=Path, default=DEFAULT_BASE)
    train.add_argument("--epochs", type=int, default=6)
    train.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 x rank)")
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument(
        "--encoder-layers", type=int, help="all_layers: LoRA on the last N encoder layers only"
    )
    train.add_argument("--clips", type=int, help="train on the first N clips only")
    train.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    train.set_defaults(run=_train)

    evaluation = commands.add_parser("evaluate", help="compare adapters through the server")
    evaluation.add_argument("adapters", nargs="+", help="adapter names served by whisper_lora")
    evaluation.add_argument("--url", default="127.0.0.1:8001", help="tritonserver gRPC host:port")
    evaluation.add_argument("--limit", type=int, help="only the first N sentences of each set")
    evaluation.set_defaults(run=_evaluate)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
