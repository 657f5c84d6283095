"""openai-whisper's word timings for an audio file on (adapter-merged) weights, from .venv:

    .venv/bin/python -m tests.openai_whisper AUDIO [--adapter DIR] [--base DIR] [--language en]
        [--option KEY=JSON ...] [--json]

Decodes AUDIO as the server does (lora_serving.audio), converts the PEFT-merged float32 model
(tests/openai_whisper/convert.py; cached under ~/.cache/lora-serving/openai-whisper-checkpoints,
keyed by the folders' paths and modification times), runs openai-whisper's transcribe(
word_timestamps=True) in its own environment and prints one line per word (start, end,
probability, word), or transcribe()'s whole result with --json.
"""

import argparse
import json
import os
from pathlib import Path

from tests.openai_whisper import reference_transcribe
from tests.openai_whisper.convert import convert

ROOT = Path(__file__).resolve().parents[2]


def cached_checkpoint(base: Path, adapter: Path | None) -> Path:
    folders = [base] if adapter is None else [base, adapter]
    key = "-".join(
        f"{folder.resolve().name}{int(max(p.stat().st_mtime for p in folder.iterdir()))}"
        for folder in folders
    )
    cache = Path(os.environ.get("LORA_SERVING_CACHE", Path.home() / ".cache/lora-serving"))
    path = cache / "openai-whisper-checkpoints" / f"{key}.pt"
    return path if path.exists() else convert(base, adapter, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("audio", type=Path)
    parser.add_argument("--base", type=Path, default=ROOT / "demo_models" / "whisper-base")
    parser.add_argument("--adapter", type=Path, default=None)
    parser.add_argument("--language", default="en")
    parser.add_argument("--task", default="transcribe")
    parser.add_argument("--option", action="append", default=[], help="transcribe() KEY=JSON")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from lora_serving.audio import decode_audio_file, to_whisper_input

    samples, rate = decode_audio_file(args.audio.read_bytes(), max_seconds=1800)
    samples = to_whisper_input(samples, rate, max_seconds=1800)
    options = {"language": args.language, "task": args.task}
    for item in args.option:
        key, _, value = item.partition("=")
        options[key] = json.loads(value)
    checkpoint = cached_checkpoint(args.base, args.adapter)
    [result] = reference_transcribe([(checkpoint, samples, options)])
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for segment in result["segments"]:
        for word in segment.get("words", []):
            start, end, probability = word["start"], word["end"], word["probability"]
            print(f"{start:8.2f} {end:8.2f} {probability:.3f} {word['word']}")


if __name__ == "__main__":
    main()
