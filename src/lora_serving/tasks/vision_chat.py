"""Qwen-VL chat: prompt + images and/or one video -> one VisionChatJob (chat prompt + media).

Inputs and outputs are Triton vllm_backend's (`text_input`, `image`, `sampling_parameters` with
every generation field of sampling.py incl. `structured_outputs`, `exclude_input_in_output`, the
`return_*` additional outputs), plus `video` (encoded frames in order) and `video_fps`. Media are
decoded and checked here, so a bad one fails its own request with a message naming it; the
model's own processor (inside vLLM) resizes them within the configured pixel limits.
"""

import dataclasses
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lora_serving import vision
from lora_serving.adapter_access import AdapterResolver
from lora_serving.adapters.catalog import Adapter
from lora_serving.errors import ConfigError, InvalidRequest
from lora_serving.jobs import EngineSession, GenerationChunk, RequestPlan, SentTokens
from lora_serving.request_inputs import RawRequest
from lora_serving.sampling import GENERATION_FIELDS
from lora_serving.settings import EngineSettings
from lora_serving.tasks import additional_outputs
from lora_serving.tasks.base import RowReader

IMAGE_PLACEHOLDER = "<|image_pad|>"
VIDEO_PLACEHOLDER = "<|video_pad|>"
DEFAULT_VIDEO_FPS = 2.0
VLLM_DEFAULT_ITEM_LIMIT = 999  # vLLM's per-prompt limit for a modality missing from the config


@dataclass(frozen=True)
class VisionOptions:
    """model.json `serving.task` for vision_chat."""

    # false: an image over the processor's max_pixels is refused instead of downscaled.
    resize_images: bool = True
    # Checked before decoding, so a huge (or decompression-bomb) file costs nothing.
    max_decode_pixels: int = 4096 * 4096
    max_video_frames: int = 32

    @classmethod
    def from_settings(cls, settings: EngineSettings) -> "VisionOptions":
        raw = dict(settings.serving.task)
        known = {f.name: f for f in dataclasses.fields(cls)}
        problems = [
            f"unknown serving.task key '{key}' (allowed: {', '.join(sorted(known))})"
            for key in sorted(set(raw) - set(known))
        ]
        for key in set(raw) & set(known):
            value, default = raw[key], known[key].default
            if isinstance(default, bool) and type(value) is not bool:
                problems.append(f"serving.task.{key} must be true or false, got {value!r}")
            elif not isinstance(default, bool) and (type(value) is not int or value <= 0):
                problems.append(f"serving.task.{key} must be an integer > 0, got {value!r}")
        if problems:
            raise ConfigError("model.json", problems)
        return cls(**raw)


@dataclass
class VisionChatJob:
    """One batch row: a chat prompt with its media, one engine request."""

    prompt: dict[str, Any]  # vLLM's prompt: {"prompt": text, "multi_modal_data": {...}}
    sampling: dict[str, Any]  # SamplingParams keyword arguments
    adapter: Adapter | None
    prompt_text: str  # the chat-templated text (sent back first unless exclude_input)
    exclude_input: bool
    outputs: frozenset[str]  # additional outputs asked for
    logprobs_asked: bool
    sent: SentTokens = field(default_factory=SentTokens)

    def run(self, engine: EngineSession) -> AsyncIterator[GenerationChunk]:
        return engine.stream(self.prompt, self.sampling)


def item_limit(settings: EngineSettings, modality: str) -> int:
    """limit_mm_per_prompt's count for a modality (an int or vLLM's {"count": n, ...} form)."""
    limit = (settings.engine_args.get("limit_mm_per_prompt") or {}).get(modality)
    if isinstance(limit, dict):
        limit = limit.get("count", VLLM_DEFAULT_ITEM_LIMIT)
    return VLLM_DEFAULT_ITEM_LIMIT if limit is None else int(limit)


class VisionChatTask:
    output_names = ("text_output", *additional_outputs.NAMES)

    def __init__(self, settings: EngineSettings, adapters: AdapterResolver, tokenizer):
        self.tokenizer = tokenizer
        max_len = int(settings.engine_args.get("max_model_len") or 4096)
        self.reader = RowReader(
            settings,
            adapters,
            max_tokens_limit=settings.serving.max_tokens_limit or max_len,
            sampling_defaults={
                "temperature": 0.0,
                "max_tokens": settings.serving.default_max_tokens,
            },
            task_fields=GENERATION_FIELDS,
            sampling_from_parameters=True,
        )
        self.options = VisionOptions.from_settings(settings)
        self.max_images = item_limit(settings, "image")
        self.max_videos = item_limit(settings, "video")
        self.image_limits = vision.processor_pixel_limits(
            Path(settings.engine_args["model"]),
            settings.engine_args.get("mm_processor_kwargs"),
            "image",
        )
        self.max_payload = settings.serving.max_payload_bytes

    @staticmethod
    def engine_overrides(settings: EngineSettings) -> dict[str, Any]:
        """No overrides; checks serving.task before the engine starts (a typo fails the load)."""
        VisionOptions.from_settings(settings)
        return {}

    @staticmethod
    def adapter_module_check(settings: EngineSettings):
        """Vision-tower/merger weights need enable_tower_connector_lora, or they'd be ignored."""
        if settings.engine_args.get("enable_tower_connector_lora"):
            return None

        def check(modules: set[str]) -> list[str]:
            vision_modules = sorted(m for m in modules if ".visual." in f".{m}")
            if not vision_modules:
                return []
            return [
                f"{len(vision_modules)} vision tower/merger module(s) would be ignored because "
                f"enable_tower_connector_lora is off in model.json: {', '.join(vision_modules[:4])}"
            ]

        return check

    # ---- request -> jobs ---------------------------------------------------------------------
    def build_plan(self, raw: RawRequest) -> RequestPlan:
        wanted = additional_outputs.requested(raw, self.reader.rows(raw))
        return self.reader.plan(raw, lambda raw, row: self._job(raw, row, wanted))

    def _job(self, raw: RawRequest, row: int, wanted: frozenset[str]) -> VisionChatJob:
        text = raw.string("text_input", row, default="") or ""
        images = self._images(raw, row)
        video = self._video(raw, row)
        sampling, adapter = self.reader.sampling_and_adapter(raw, row)
        exclude_input = raw.boolean("exclude_input_in_output", row, default=False)
        if raw.has("exclude_input_in_output") and not exclude_input and self._streaming(raw):
            raise InvalidRequest(
                "exclude_input_in_output=false cannot be streamed: streamed responses carry "
                "only the new text (vllm_backend refuses it too)"
            )
        if not text.strip() and not images and video is None:
            raise InvalidRequest("empty request: give text_input, an image or a video")
        if raw.boolean("apply_chat_template", row, default=True):
            prompt_text = self._chat_prompt(
                text, len(images), video is not None, raw.string("system_prompt", row)
            )
        else:
            prompt_text = text
            _check_placeholders(text, IMAGE_PLACEHOLDER, len(images), "image(s)")
            _check_placeholders(text, VIDEO_PLACEHOLDER, int(video is not None), "video(s)")
        media: dict[str, list] = {}
        if images:
            media["image"] = images
        if video is not None:
            media["video"] = [video]
        prompt: dict[str, Any] = {"prompt": prompt_text}
        if media:
            prompt["multi_modal_data"] = media
        return VisionChatJob(
            prompt=prompt,
            sampling=additional_outputs.with_logprobs_for(wanted, sampling),
            adapter=adapter,
            prompt_text=prompt_text,
            exclude_input=exclude_input,
            outputs=wanted,
            logprobs_asked=sampling.get("logprobs") is not None,
        )

    @staticmethod
    def _streaming(raw: RawRequest) -> bool:
        return raw.has("stream") and raw.boolean("stream", 0, default=False)

    def _encoded_items(self, raw: RawRequest, name: str, row: int) -> list[bytes]:
        items = raw.raw_bytes(name, row) if raw.has(name) else []
        for index, data in enumerate(items):
            if len(data) > self.max_payload:
                raise InvalidRequest(
                    f"{name}[{index}] is {len(data)} bytes, over the {self.max_payload} byte limit"
                )
        return items

    def _images(self, raw: RawRequest, row: int) -> list:
        encoded = self._encoded_items(raw, "image", row)
        if len(encoded) > self.max_images:
            raise InvalidRequest(
                f"request carries {len(encoded)} images; this model accepts at most "
                f"{self.max_images} per prompt (limit_mm_per_prompt in model.json)"
            )
        images = [
            vision.decode_image(data, index=i, max_pixels=self.options.max_decode_pixels)
            for i, data in enumerate(encoded)
        ]
        if not self.options.resize_images:
            limit = self.image_limits.max_pixels
            for index, image in enumerate(images):
                width, height = image.size
                if width * height > limit:
                    raise InvalidRequest(
                        f"image[{index}] has {width}x{height} = {width * height} pixels, over "
                        f"this model's max_pixels of {limit}; resizing is off "
                        "(serving.task.resize_images in model.json)"
                    )
        return images

    def _video(self, raw: RawRequest, row: int) -> tuple | None:
        """One video per row: its frames in order -> (frames array, metadata) as vLLM takes it."""
        frames = self._encoded_items(raw, "video", row)
        if not frames:
            return None
        if self.max_videos < 1:
            raise InvalidRequest(
                "this model accepts no video (limit_mm_per_prompt.video is 0 in model.json)"
            )
        if len(frames) > self.options.max_video_frames:
            raise InvalidRequest(
                f"video has {len(frames)} frames; at most {self.options.max_video_frames} "
                "allowed (serving.task.max_video_frames in model.json)"
            )
        fps = raw.number("video_fps", row, default=DEFAULT_VIDEO_FPS)
        if not fps > 0 or not math.isfinite(fps):
            raise InvalidRequest(f"video_fps must be > 0, got {fps:g}")
        array = vision.decode_video(frames, max_pixels=self.options.max_decode_pixels)
        return array, vision.video_metadata(len(array), fps)

    def _chat_prompt(
        self, text: str, num_images: int, has_video: bool, system_prompt: str | None
    ) -> str:
        content: list[dict[str, str]] = [{"type": "image"} for _ in range(num_images)]
        if has_video:
            content.append({"type": "video"})
        if text:
            content.append({"type": "text", "text": text})
        messages = []
        if system_prompt:
            messages.append({"role": "system", "content": system_prompt})
        messages.append({"role": "user", "content": content})
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    # ---- chunks -> outputs -------------------------------------------------------------------
    def render(self, job: VisionChatJob, chunk: GenerationChunk, *, stream: bool) -> dict[str, Any]:
        if stream:
            text = chunk.delta
        elif job.exclude_input:
            text = chunk.text
        else:  # vllm_backend's default: the prompt, then the completion
            text = job.prompt_text + chunk.text
        return {
            "text_output": text,
            **additional_outputs.render(
                job.outputs,
                chunk,
                stream=stream,
                sent=job.sent,
                logprobs_asked=job.logprobs_asked,
            ),
        }


def _check_placeholders(text: str, placeholder: str, expected: int, what: str) -> None:
    found = text.count(placeholder)
    if found != expected:
        raise InvalidRequest(
            f"apply_chat_template=false: text_input has {found} {placeholder} placeholder(s) "
            f"but the request carries {expected} {what}"
        )
