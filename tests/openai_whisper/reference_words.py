"""openai-whisper's transcribe(word_timestamps=True): the reference for word timings.

Runs in openai-whisper's own environment (scripts/openai_whisper.sh), never in .venv:
    scripts/openai_whisper.sh tests/openai_whisper/reference_words.py JOB.json
JOB.json: {"runs": [{"checkpoint": ".pt from convert.py", "audio": ".npy of 16 kHz mono float32",
"options": {transcribe() keyword arguments}}, ...]}. Prints one JSON list, one result per run:
transcribe()'s own dict (text, language, segments with their words). The samples are the ones
the server decodes (openai-whisper's load_audio would shell out to an ffmpeg binary).

Options not given are whisper_lora's defaults, which are transcribe()'s own: temperature
fallback (0.0, 0.2, ..., 1.0), compression_ratio_threshold 2.4, logprob_threshold -1.0,
no_speech_threshold 0.6, condition_on_previous_text true, suppress_tokens "-1", suppress_blank;
plus word_timestamps=True, fp16=False (float32 on the CPU), verbose=None.
"""

import json
import sys

import numpy as np
import torch
import whisper

_models: dict = {}


def load(checkpoint: str) -> whisper.Whisper:
    """The converted model with the checkpoint's alignment heads (openai-whisper knows those of
    its own model names only), built the way `Whisper.set_alignment_heads` builds them."""
    if checkpoint not in _models:
        model = whisper.load_model(checkpoint, device="cpu")
        heads = torch.load(checkpoint, map_location="cpu", weights_only=True)["alignment_heads"]
        mask = torch.zeros(model.dims.n_text_layer, model.dims.n_text_head, dtype=torch.bool)
        for layer, head in heads:
            mask[layer, head] = True
        model.register_buffer("alignment_heads", mask.to_sparse(), persistent=False)
        _models[checkpoint] = model
    return _models[checkpoint]


def run(job: dict) -> dict:
    options = {"word_timestamps": True, "fp16": False, "verbose": None, **job.get("options", {})}
    if isinstance(options.get("temperature"), list):
        options["temperature"] = tuple(options["temperature"])
    audio = np.load(job["audio"]).astype(np.float32)
    with torch.inference_mode():
        return whisper.transcribe(load(job["checkpoint"]), audio, **options)


def main() -> None:
    torch.set_num_threads(1)
    with open(sys.argv[1]) as file:
        runs = json.load(file)["runs"]
    json.dump([run(job) for job in runs], sys.stdout)


if __name__ == "__main__":
    main()
