"""faster-whisper's side of the word-error-rate bench, run as a script by faster-whisper's own
virtual environment (lora_tools.bench.peer_env): it imports only the standard library and
faster_whisper, never lora_serving.

    <faster-whisper venv>/bin/python faster_whisper_peer.py JOB.json

JOB.json: {"model_dir": folder with model.bin, config.json, tokenizer.json, vocabulary.txt,
           "threads": CTranslate2 cpu_threads, "files": [audio paths],
           "settings": {name: keyword arguments of WhisperModel.transcribe},
           "compute_type": CTranslate2's ("float32" if absent; "int8" is its fastest on CPU),
           "warm_up": "each" (default) or "once"}
A setting with `batch_size` runs through faster-whisper's BatchedInferencePipeline (its way
with long recordings: 30 s pieces decoded together) instead of WhisperModel.transcribe.
Prints one JSON object to stdout: {name: {"texts": [...], "seconds": [...], "segments": [...]}},
one entry per file, in order (a file's segments: [{"start", "end", "text"}], with "words" under
word_timestamps=True); each setting (or
only the first, with "warm_up": "once") first transcribes the first file once, untimed. A file's
time covers transcribe() and consuming its segments (decoding the file included, as the server
decodes the file it is sent).
"""

import json
import sys
import time
from pathlib import Path


def _segment(segment) -> dict:
    """A segment as JSON; with word_timestamps=True its words too."""
    kept = {"start": segment.start, "end": segment.end, "text": segment.text}
    if segment.words:
        kept["words"] = [
            {"word": w.word, "start": w.start, "end": w.end, "probability": w.probability}
            for w in segment.words
        ]
    return kept


def run(job: dict) -> dict:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    model = WhisperModel(
        job["model_dir"],
        device="cpu",
        compute_type=job.get("compute_type", "float32"),
        cpu_threads=job["threads"],
    )
    batched = BatchedInferencePipeline(model)

    def transcribe(path: str, options: dict) -> list:
        runner = batched if "batch_size" in options else model
        segments, _ = runner.transcribe(path, **options)
        return list(segments)

    results = {}
    for index, (name, options) in enumerate(job["settings"].items()):
        if index == 0 or job.get("warm_up", "each") == "each":
            transcribe(job["files"][0], options)
        texts, seconds, kept = [], [], []
        for path in job["files"]:
            started = time.perf_counter()
            segments = transcribe(path, options)
            seconds.append(time.perf_counter() - started)
            texts.append("".join(segment.text for segment in segments).strip())
            kept.append([_segment(s) for s in segments])
        results[name] = {"texts": texts, "seconds": seconds, "segments": kept}
    return results


if __name__ == "__main__":
    print(json.dumps(run(json.loads(Path(sys.argv[1]).read_text()))))
