"""perf_analyzer `--input-data` files for our models, with the adapter in the `lora_name` tensor.

perf_analyzer's `--request-parameter lora_name:x:string` is fixed for a whole run, so a run that
mixes adapters names them in the `lora_name` input tensor instead: each entry of "data" is one
request, and perf_analyzer sends them in order across its concurrent streams (round-robin over
adapters; checked in the profile export, whose `request_inputs` name each request's entry).
"""

import base64
import io
import json
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16_000


def speech_like_audio(seconds: float, seed: int, rate: int = SAMPLE_RATE) -> np.ndarray:
    """Deterministic voiced-sounding audio (harmonics with a syllable envelope), float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    pitch = 110 + 40 * rng.random()
    wave = sum(np.sin(2 * np.pi * pitch * k * t) / k for k in range(1, 6))
    envelope = 0.5 * (1 + np.sin(2 * np.pi * 3.5 * t + rng.random() * 6))
    return (0.1 * wave * envelope + 0.005 * rng.standard_normal(t.size)).astype(np.float32)


def wav_bytes(samples: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    """16-bit PCM WAV, what a client would upload (about 32 kB per second of audio)."""
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def adapter_names(count: int, prefix: str = "b") -> list[str]:
    """b00, b01, ...: the benchmark's adapter names."""
    width = max(2, len(str(count - 1)))
    return [f"{prefix}{index:0{width}d}" for index in range(count)]


def _tensor(value) -> dict:
    return {"content": [value], "shape": [1]}


def _entries(
    adapters: list[str | None], items: int, max_tokens: int, fields, *, stream: bool = False
) -> dict:
    """`items` requests (rounded up so every adapter gets as many), adapters round-robin;
    `fields(index)` gives each request's own inputs."""
    count = -(-max(items, len(adapters)) // len(adapters)) * len(adapters)
    entries = []
    for index in range(count):
        # ignore_eos: every request decodes max_tokens, so runs compare equal work
        entry = fields(index) | {
            "sampling_parameters": _tensor(
                json.dumps({"max_tokens": max_tokens, "ignore_eos": True})
            ),
        }
        if stream:  # one response per decoded piece: perf_analyzer sees the first token
            entry["stream"] = _tensor(True)
        adapter = adapters[index % len(adapters)]
        if adapter:
            entry["lora_name"] = _tensor(adapter)
        entries.append(entry)
    return {"data": entries}


def whisper_input_data(
    adapters: list[str | None],
    *,
    seconds: float = 5.0,
    clips: int = 4,
    max_tokens: int = 32,
    language: str = "en",
    stream: bool = False,
    audio_format: str = "samples",
) -> dict:
    """`audio_format` "samples": FP32 samples in `audio`; "wav": a 16-bit WAV file, base64, in
    `audio_file` (what clients upload; a twentieth of the JSON, so 32-entry files stay small).
    Request i carries clip i (seed i) whatever the adapter, so workloads share their clips."""
    if audio_format not in ("samples", "wav"):
        raise ValueError(f"audio_format must be 'samples' or 'wav', got {audio_format!r}")

    def fields(index: int) -> dict:
        audio = speech_like_audio(seconds, seed=index)
        if audio_format == "wav":
            inputs = {"audio_file": _tensor(base64.b64encode(wav_bytes(audio)).decode("ascii"))}
        else:
            inputs = {
                "audio": {"content": audio.tolist(), "shape": [audio.size]},
                "sample_rate": _tensor(SAMPLE_RATE),
            }
        return inputs | {"language": _tensor(language)}

    return _entries(adapters, clips, max_tokens, fields, stream=stream)


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
    stream: bool = False,
) -> dict:
    def fields(index: int) -> dict:
        image = synthetic_image_png(*image_size, seed=index)
        return {
            "text_input": _tensor(prompt),
            "image": _tensor(base64.b64encode(image).decode("ascii")),
            "exclude_input_in_output": _tensor(True),
        }

    return _entries(adapters, images, max_tokens, fields, stream=stream)


def rotated(data: dict, shift: int) -> dict:
    """The same entries starting at entry `shift`: successive runs that send fewer requests
    than there are entries still go through all of them (all 32 adapters, say)."""
    entries = data["data"]
    if not entries:
        return {"data": []}
    shift %= len(entries)
    return {"data": entries[shift:] + entries[:shift]}


def entry_adapter(entry: dict) -> str | None:
    """The adapter an entry names (None: the base model)."""
    tensor = entry.get("lora_name")
    return tensor["content"][0] if tensor else None


def write(data: dict, path: Path) -> Path:
    path.write_text(json.dumps(data))
    return path
