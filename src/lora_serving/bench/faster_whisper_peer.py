"""faster-whisper's side of the word-error-rate bench, run as a script by faster-whisper's own
virtual environment (lora_serving.bench.peer_env): it imports only the standard library and
faster_whisper, never lora_serving.

    <faster-whisper venv>/bin/python faster_whisper_peer.py JOB.json

JOB.json: {"model_dir": folder with model.bin, config.json, tokenizer.json, vocabulary.txt,
           "threads": CTranslate2 cpu_threads, "files": [audio paths],
           "settings": {name: keyword arguments of WhisperModel.transcribe}}
Prints one JSON object to stdout: {name: {"texts": [...], "seconds": [...], "segments": [...]}},
one entry per file, in order (a file's segments: [{"start", "end", "text"}]); each setting first
transcribes the first file once, untimed (warm-up). A file's time covers transcribe() and
consuming its segments (decoding the file included, as the server decodes the file it is sent).
"""

import json
import sys
import time
from pathlib import Path


def run(job: dict) -> dict:
    from faster_whisper import WhisperModel

    model = WhisperModel(
        job["model_dir"], device="cpu", compute_type="float32", cpu_threads=job["threads"]
    )

    def transcribe(path: str, options: dict) -> list:
        segments, _ = model.transcribe(path, **options)
        return list(segments)

    results = {}
    for name, options in job["settings"].items():
        transcribe(job["files"][0], options)
        texts, seconds, kept = [], [], []
        for path in job["files"]:
            started = time.perf_counter()
            segments = transcribe(path, options)
            seconds.append(time.perf_counter() - started)
            texts.append("".join(segment.text for segment in segments).strip())
            kept.append([{"start": s.start, "end": s.end, "text": s.text} for s in segments])
        results[name] = {"texts": texts, "seconds": seconds, "segments": kept}
    return results


if __name__ == "__main__":
    print(json.dumps(run(json.loads(Path(sys.argv[1]).read_text()))))
