"""Encoded images and video frames as Triton clients send them -> PIL images / frame arrays.

Pillow decodes; the model's own processor resizes later, within the pixel limits that
`processor_pixel_limits` resolves the same way vLLM does (preprocessor config, then model.json's
mm_processor_kwargs), so what we check here is what the processor will apply.
"""

import base64
import binascii
import io
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image, UnidentifiedImageError

from lora_serving.errors import InvalidRequest

_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"RIFF", b"GIF8", b"BM")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The Qwen-VL processors refuse more extreme shapes (smart_resize raises).
MAX_ASPECT_RATIO = 200


def _looks_encoded(data: bytes) -> bool:
    return data.startswith(_MAGIC)


def _png_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG header; Pillow refuses 0-sized PNGs with a vague error."""
    if data.startswith(_PNG_SIGNATURE) and data[12:16] == b"IHDR" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    return None


def decode_image(data: bytes, *, index: int, max_pixels: int, label: str = "image") -> Image.Image:
    """Bytes (raw or base64 text, as vllm_backend clients send) -> RGB image, size-checked."""
    label = f"{label}[{index}]"
    if not data:
        raise InvalidRequest(f"{label} is empty (0 bytes)")
    if not _looks_encoded(data):
        text = data.split(b",", 1)[1] if data.startswith(b"data:") else data
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(
                f"{label} is neither an encoded image (PNG, JPEG, WebP) nor valid base64"
            ) from None
        if not data:
            raise InvalidRequest(f"{label} is empty (0 bytes)")
    header_size = _png_size(data)
    if header_size is not None and 0 in header_size:
        raise InvalidRequest(f"{label} has zero size ({header_size[0]}x{header_size[1]})")
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width == 0 or height == 0:
                raise InvalidRequest(f"{label} has zero size ({width}x{height})")
            if width * height > max_pixels:
                raise InvalidRequest(
                    f"{label} has {width}x{height} pixels, over the limit of {max_pixels}"
                )
            if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
                raise InvalidRequest(
                    f"{label} is {width}x{height}: the aspect ratio is over "
                    f"{MAX_ASPECT_RATIO}, which the model's processor refuses"
                )
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as err:
        raise InvalidRequest(f"{label} could not be decoded as PNG, JPEG or WebP: {err}") from None


def decode_video(frames: list[bytes], *, max_pixels: int) -> np.ndarray:
    """Encoded frames, in order -> uint8 array (frames, height, width, 3); one size for all."""
    if not frames:
        raise InvalidRequest("video has no frames")
    images = [
        decode_image(data, index=i, max_pixels=max_pixels, label="video frame")
        for i, data in enumerate(frames)
    ]
    first = images[0].size
    for index, image in enumerate(images[1:], start=1):
        if image.size != first:
            raise InvalidRequest(
                f"video frame[{index}] is {image.size[0]}x{image.size[1]} but frame[0] is "
                f"{first[0]}x{first[1]}: all frames of a video must have the same size"
            )
    return np.stack([np.asarray(image) for image in images])


def video_metadata(num_frames: int, fps: float) -> dict:
    """vLLM's metadata for frames already sampled at `fps` (Qwen2.5-VL needs it for M-RoPE)."""
    return {
        "total_num_frames": num_frames,
        "fps": fps,
        "duration": num_frames / fps,
        "frames_indices": list(range(num_frames)),
    }


@dataclass(frozen=True)
class PixelLimits:
    """The pixel budget the model's processor resizes an image (or a video frame) into."""

    min_pixels: int
    max_pixels: int


_PROCESSOR_FILES = {"image": "preprocessor_config.json", "video": "video_preprocessor_config.json"}


def processor_pixel_limits(
    model_dir: Path,
    mm_processor_kwargs: Mapping | None,
    modality: Literal["image", "video"] = "image",
) -> PixelLimits:
    """Effective min/max pixels, resolved as vLLM 0.32 does for Qwen-VL.

    Processor config `size` (shortest_edge / longest_edge), overridden by model.json's flat
    mm_processor_kwargs (`min_pixels`, `max_pixels`, `size`), overridden by the scoped ones
    (`images_kwargs` / `videos_kwargs`).
    """
    path = Path(model_dir) / _PROCESSOR_FILES[modality]
    if not path.is_file():
        path = Path(model_dir) / _PROCESSOR_FILES["image"]
    config = json.loads(path.read_text())
    limits = _size_edges(config)
    kwargs = dict(mm_processor_kwargs or {})
    scoped = kwargs.get("images_kwargs" if modality == "image" else "videos_kwargs") or {}
    for layer in (kwargs, scoped):
        limits.update(_size_edges(layer))
    return PixelLimits(int(limits["shortest_edge"]), int(limits["longest_edge"]))


def _size_edges(options: Mapping) -> dict[str, int]:
    edges = {k: v for k, v in (options.get("size") or {}).items() if v is not None}
    for edge, pixels in (("shortest_edge", "min_pixels"), ("longest_edge", "max_pixels")):
        if options.get(pixels) is not None:
            edges[edge] = options[pixels]
    return {k: v for k, v in edges.items() if k in ("shortest_edge", "longest_edge")}
