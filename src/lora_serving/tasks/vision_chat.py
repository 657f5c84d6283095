"""Qwen-VL chat: text prompt + images -> chat-templated prompt + image job (vllm_backend's I/O)."""

from typing import Any

from lora_serving import vision
from lora_serving.adapters import AdapterCatalog
from lora_serving.errors import InvalidRequest
from lora_serving.jobs import GenerationChunk, GenerationJob, RequestPlan
from lora_serving.request_inputs import RawRequest
from lora_serving.settings import EngineSettings
from lora_serving.tasks.base import RowReader

IMAGE_PLACEHOLDER = "<|image_pad|>"
DEFAULT_MAX_DECODE_PIXELS = 4096 * 4096  # before the processor resizes; guards decoding cost


class VisionChatTask:
    output_names = ("text_output", "finish_reason", "num_input_tokens", "num_output_tokens")

    def __init__(self, settings: EngineSettings, catalog: AdapterCatalog, tokenizer):
        self.tokenizer = tokenizer
        max_len = int(settings.engine_args.get("max_model_len") or 4096)
        self.reader = RowReader(
            settings,
            catalog,
            max_tokens_limit=settings.serving.max_tokens_limit or max_len,
            sampling_defaults={
                "temperature": 0.0,
                "max_tokens": settings.serving.default_max_tokens,
            },
        )
        limits = settings.engine_args.get("limit_mm_per_prompt") or {}
        self.max_images = int(limits.get("image", 1))
        self.max_decode_pixels = int(
            settings.serving.task.get("max_decode_pixels", DEFAULT_MAX_DECODE_PIXELS)
        )
        self.max_payload = settings.serving.max_payload_bytes

    @staticmethod
    def engine_overrides(settings: EngineSettings) -> dict[str, Any]:
        return {}

    @staticmethod
    def adapter_module_check(settings: EngineSettings):
        """Vision-tower/merger weights need enable_tower_connector_lora, or they'd be ignored."""
        if settings.engine_args.get("enable_tower_connector_lora"):
            return None

        def check(modules: set[str]) -> list[str]:
            vision = sorted(m for m in modules if ".visual." in f".{m}")
            if not vision:
                return []
            return [
                f"{len(vision)} vision tower/merger module(s) would be ignored because "
                f"enable_tower_connector_lora is off in model.json: {', '.join(vision[:4])}"
            ]

        return check

    def build_plan(self, raw: RawRequest) -> RequestPlan:
        rows = self.reader.rows(raw)
        stream = self.reader.stream_flag(raw, rows)
        return RequestPlan([self._job(raw, row) for row in rows], stream=stream)

    def _job(self, raw: RawRequest, row: int) -> GenerationJob:
        text = raw.string("text_input", row, default="") or ""
        images = self._images(raw, row)
        sampling, adapter = self.reader.sampling_and_adapter(raw, row)
        if not text.strip() and not images:
            raise InvalidRequest("empty request: give text_input, an image, or both")
        if raw.boolean("apply_chat_template", row, default=True):
            prompt_text = self._chat_prompt(text, len(images), raw.string("system_prompt", row))
        else:
            prompt_text = text
            placeholders = text.count(IMAGE_PLACEHOLDER)
            if placeholders != len(images):
                raise InvalidRequest(
                    f"apply_chat_template=false: text_input has {placeholders} image "
                    f"placeholder(s) ({IMAGE_PLACEHOLDER}) but the request carries "
                    f"{len(images)} image(s)"
                )
        prompt: dict[str, Any] = {"prompt": prompt_text}
        if images:
            prompt["multi_modal_data"] = {"image": images}
        return GenerationJob(
            prompt=prompt,
            sampling=sampling,
            adapter=adapter,
            context={
                "prompt_text": prompt_text,
                "exclude_input": raw.boolean("exclude_input_in_output", row, default=False),
            },
        )

    def _images(self, raw: RawRequest, row: int) -> list:
        if not raw.has("image"):
            return []
        encoded = [item for item in raw.raw_bytes("image", row) if item]
        if len(encoded) > self.max_images:
            raise InvalidRequest(
                f"request carries {len(encoded)} images; this model accepts at most "
                f"{self.max_images} per prompt"
            )
        for index, data in enumerate(encoded):
            if len(data) > self.max_payload:
                raise InvalidRequest(
                    f"image[{index}] is {len(data)} bytes, over the {self.max_payload} byte limit"
                )
        return [
            vision.decode_image(data, index=i, max_pixels=self.max_decode_pixels)
            for i, data in enumerate(encoded)
        ]

    def _chat_prompt(self, text: str, num_images: int, system_prompt: str | None) -> str:
        content: list[dict[str, str]] = [{"type": "image"} for _ in range(num_images)]
        if text:
            content.append({"type": "text", "text": text})
        messages = []
        if system_prompt:
            messages.append({"role": "system", "content": system_prompt})
        messages.append({"role": "user", "content": content})
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    def render(self, job: GenerationJob, chunk: GenerationChunk, *, stream: bool) -> dict[str, Any]:
        if stream:
            text = chunk.delta
        elif job.context["exclude_input"]:
            text = chunk.text
        else:  # vllm_backend's default: the prompt, then the completion
            text = job.context["prompt_text"] + chunk.text
        return {
            "text_output": text,
            "finish_reason": chunk.finish_reason or "",
            "num_input_tokens": chunk.num_prompt_tokens,
            "num_output_tokens": chunk.num_output_tokens,
        }
