"""Encoded images as Triton clients send them (raw bytes or base64 strings) -> PIL images.

Pillow decodes; the model's own processor resizes later (min/max pixels in preprocessor config).
"""

import base64
import binascii
import io

from PIL import Image, UnidentifiedImageError

from lora_serving.errors import InvalidRequest

_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"RIFF", b"GIF8", b"BM")


def _looks_encoded(data: bytes) -> bool:
    return data.startswith(_MAGIC)


def decode_image(data: bytes, *, index: int, max_pixels: int) -> Image.Image:
    """Bytes (raw or base64 text, as vllm_backend clients send) -> RGB image, size-checked."""
    label = f"image[{index}]"
    if not data:
        raise InvalidRequest(f"{label} is empty")
    if not _looks_encoded(data):
        text = data.split(b",", 1)[1] if data.startswith(b"data:") else data
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(
                f"{label} is neither an encoded image (PNG, JPEG, WebP) nor valid base64"
            ) from None
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width == 0 or height == 0:
                raise InvalidRequest(f"{label} has zero size")
            if width * height > max_pixels:
                raise InvalidRequest(
                    f"{label} has {width}x{height} pixels, over the limit of {max_pixels}"
                )
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as err:
        raise InvalidRequest(f"{label} could not be decoded as PNG, JPEG or WebP: {err}") from None
