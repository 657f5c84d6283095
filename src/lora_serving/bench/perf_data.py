"""perf_analyzer `--input-data` files for our models, with the adapter in the `lora_name` tensor.

perf_analyzer's `--request-parameter lora_name:x:string` is fixed for a whole run, so a run that
mixes adapters names them in the `lora_name` input tensor instead: each entry of "data" is one
request, and perf_analyzer cycles through them (round-robin over adapters).
"""

import base64
import io
import json
from pathlib import Path

import numpy as np


def speech_like_audio(seconds: float, seed: int, rate: int = 16_000) -> np.ndarray:
    """Deterministic voiced-sounding audio (harmonics with a syllable envelope), float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    pitch = 110 + 40 * rng.random()
    wave = sum(np.sin(2 * np.pi * pitch * k * t) / k for k in range(1, 6))
    envelope = 0.5 * (1 + np.sin(2 * np.pi * 3.5 * t + rng.random() * 6))
    return (0.1 * wave * envelope + 0.005 * rng.standard_normal(t.size)).astype(np.float32)


def whisper_input_data(
    adapters: list[str | None],
    *,
    seconds: float = 5.0,
    clips: int = 4,
    max_tokens: int = 32,
    language: str = "en",
) -> dict:
    entries = []
    for index in range(max(clips, len(adapters))):
        audio = speech_like_audio(seconds, seed=index)
        entry = {
            "audio": {"content": audio.tolist(), "shape": [audio.size]},
            "sample_rate": {"content": [16000], "shape": [1]},
            "language": {"content": [language], "shape": [1]},
            "sampling_parameters": {
                "content": [json.dumps({"max_tokens": max_tokens})],
                "shape": [1],
            },
        }
        adapter = adapters[index % len(adapters)]
        if adapter:
            entry["lora_name"] = {"content": [adapter], "shape": [1]}
        entries.append(entry)
    return {"data": entries}


def synthetic_image_png(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def qwen_input_data(
    adapters: list[str | None],
    *,
    image_size: tuple[int, int] = (224, 224),
    images: int = 4,
    max_tokens: int = 32,
    prompt: str = "Describe this image.",
) -> dict:
    entries = []
    for index in range(max(images, len(adapters))):
        image = base64.b64encode(synthetic_image_png(*image_size, seed=index)).decode("ascii")
        entry = {
            "text_input": {"content": [prompt], "shape": [1]},
            "image": {"content": [image], "shape": [1]},
            "exclude_input_in_output": {"content": [True], "shape": [1]},
            "sampling_parameters": {
                "content": [json.dumps({"max_tokens": max_tokens, "ignore_eos": True})],
                "shape": [1],
            },
        }
        adapter = adapters[index % len(adapters)]
        if adapter:
            entry["lora_name"] = {"content": [adapter], "shape": [1]}
        entries.append(entry)
    return {"data": entries}


def write(data: dict, path: Path) -> Path:
    path.write_text(json.dumps(data))
    return path
