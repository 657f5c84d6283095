"""/v1/chat/completions <-> qwen_vl_lora (vllm_backend's interface).

A conversation of an optional leading system message and one user message whose images come
before its text goes to the model as it is (`text_input`, `image`, `system_prompt`), and the
model applies its own chat template: the same request a tritonclient user would send. Any other
conversation (several turns, assistant messages, text before an image) is rendered here in the
Qwen2-VL chat template (ChatML with `<|vision_start|><|image_pad|><|vision_end|>` per image,
"You are a helpful assistant." when no system message leads) and sent with
`apply_chat_template=false`.

Sampling fields of OpenAI (max_tokens / max_completion_tokens, temperature, top_p, seed, stop,
presence/frequency_penalty, logit_bias, response_format) and the extra fields vLLM's OpenAI
server takes (top_k, min_p, repetition_penalty, ignore_eos, min_tokens, stop_token_ids, ...,
structured_outputs) become `sampling_parameters`; qwen_vl_lora checks their values and names
any bad one. Usage comes from the model's `num_input_tokens` / `num_output_tokens` outputs.
"""

import base64
import binascii
import json
import time
import uuid
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, ValidationError

from lora_openai.errors import OpenAIError, bad_request

# vLLM OpenAI-server extra request fields passed to sampling_parameters unchanged.
VLLM_EXTRA_FIELDS = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "stop_token_ids",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "bad_words",
    "allowed_token_ids",
    "structured_outputs",
)
_OPENAI_SAMPLING = ("temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty")
DEFAULT_SYSTEM = "You are a helpful assistant."
IMAGE_TOKENS = "<|vision_start|><|image_pad|><|vision_end|>"
ADDITIONAL_OUTPUTS = ("return_finish_reason", "return_num_input_tokens", "return_num_output_tokens")


class ChatRequest(BaseModel):
    """OpenAI's chat completion request; fields we do not read are accepted and ignored, as
    vLLM's server does (the extra vLLM sampling fields are read from `model_extra`)."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict | None = None
    stream: bool = False
    stream_options: dict | None = None
    tools: list | None = None


def parse_request(body: object) -> ChatRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return ChatRequest.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise bad_request(f"{where}: {first['msg']}", where.split(".")[0] or None) from None


# ---- messages ------------------------------------------------------------------------------------
@dataclass
class Prompt:
    """What qwen_vl_lora receives for one conversation."""

    text: str
    image_urls: list[str] = field(default_factory=list)
    system: str | None = None
    templated: bool = False  # True: `text` is the rendered chat template


def _parts(message: dict, index: int) -> list[dict]:
    content = message.get("content")
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"messages[{index}].content must be a string or a list", "messages")
    parts = []
    for number, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url:
                raise bad_request(f"messages[{index}].content[{number}].image_url has no url")
            parts.append({"type": "image_url", "url": url})
        else:
            raise bad_request(
                f"messages[{index}].content[{number}]: type '{kind}' is not supported "
                "(text and image_url are)",
                "messages",
            )
    return parts


def _text_of(parts: list[dict], index: int, role: str) -> str:
    if any(part["type"] != "text" for part in parts):
        raise bad_request(f"messages[{index}]: a {role} message can carry text only", "messages")
    return "".join(part["text"] for part in parts)


def build_prompt(messages: list[dict]) -> Prompt:
    """OpenAI messages -> Prompt (module docstring: the model's own template when it can)."""
    if not messages:
        raise bad_request("messages must not be empty", "messages")
    turns: list[tuple[str, list[dict]]] = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant"):
            raise bad_request(
                f"messages[{index}].role '{role}' is not supported (system, developer, user, "
                "assistant are)",
                "messages",
            )
        parts = _parts(message, index)
        if role != "user":
            _text_of(parts, index, role)
        turns.append((role, parts))
    if turns[-1][0] != "user":
        raise bad_request("the last message must be the user's", "messages")
    simple = _simple(turns)
    if simple is not None:
        return simple
    return _rendered(turns)


def _simple(turns: list[tuple[str, list[dict]]]) -> Prompt | None:
    """[system] + user(images..., text?) -> the model's own template; None otherwise."""
    system = None
    if turns[0][0] == "system":
        system = "".join(part["text"] for part in turns[0][1])
        turns = turns[1:]
    if len(turns) != 1:
        return None
    parts = turns[0][1]
    images = [part["url"] for part in parts if part["type"] == "image_url"]
    texts = [part["text"] for part in parts if part["type"] == "text"]
    images_first = all(part["type"] == "image_url" for part in parts[: len(images)])
    if len(texts) > 1 or not images_first or (system is not None and not system):
        return None
    return Prompt(text=texts[0] if texts else "", image_urls=images, system=system)


def _rendered(turns: list[tuple[str, list[dict]]]) -> Prompt:
    """The Qwen2-VL chat template (chat_template.jinja of Qwen2-VL / Qwen2.5-VL), rendered."""
    out = [] if turns[0][0] == "system" else [f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n"]
    images = []
    for role, parts in turns:
        body = []
        for part in parts:
            if part["type"] == "image_url":
                images.append(part["url"])
                body.append(IMAGE_TOKENS)
            else:
                body.append(part["text"])
        out.append(f"<|im_start|>{role}\n{''.join(body)}<|im_end|>\n")
    out.append("<|im_start|>assistant\n")
    return Prompt(text="".join(out), image_urls=images, templated=True)


def decode_image_url(url: str, index: int, max_bytes: int) -> bytes:
    """A data URL (data:image/...;base64,...) or bare base64 -> the encoded image bytes.
    Remote URLs are fetched by the app (only when allowed), not here."""
    if url.startswith("data:"):
        header, sep, payload = url.partition(",")
        if not sep or not header.endswith(";base64"):
            raise bad_request(
                f"image {index}: a data URL must be base64 (data:image/png;base64,...)", "messages"
            )
    else:
        payload = url
    if len(payload) * 3 // 4 > max_bytes:
        raise OpenAIError(413, f"image {index} is over the {max_bytes} byte limit", "messages")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(
            f"image {index}: not a data URL or base64 image (remote URLs: http(s)://...)",
            "messages",
        ) from None


def is_remote(url: str) -> bool:
    return url.startswith(("http://", "https://"))


# ---- request -> Triton ---------------------------------------------------------------------------
def sampling_parameters(request: ChatRequest) -> dict:
    if request.n not in (None, 1):
        raise bad_request("n > 1 is not supported: send n requests (with different seeds)", "n")
    if request.logprobs or request.top_logprobs:
        raise bad_request("logprobs are not supported by this server yet", "logprobs")
    if request.tools:
        raise bad_request("tools are not supported", "tools")
    sampling: dict = {}
    max_tokens = request.max_completion_tokens or request.max_tokens
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    for name in _OPENAI_SAMPLING:
        value = getattr(request, name)
        if value is not None:
            sampling[name] = value
    if request.logit_bias:
        sampling["logit_bias"] = request.logit_bias
    extra = request.model_extra or {}
    for name in VLLM_EXTRA_FIELDS:
        if extra.get(name) is not None:
            sampling[name] = extra[name]
    constraint = _structured_outputs(request.response_format)
    if constraint is not None:
        if "structured_outputs" in sampling:
            raise bad_request(
                "give response_format or structured_outputs, not both", "response_format"
            )
        sampling["structured_outputs"] = constraint
    return sampling


def _structured_outputs(response_format: dict | None) -> dict | None:
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad_request(
                "response_format json_schema needs json_schema.schema (an object)",
                "response_format",
            )
        return {"json": schema}
    raise bad_request(
        f"response_format type '{kind}' is not supported (text, json_object, json_schema are)",
        "response_format",
    )


def triton_fields(prompt: Prompt, images: list[bytes], sampling: dict, *, stream: bool) -> dict:
    fields: dict = {"text_input": prompt.text, "exclude_input_in_output": True}
    if images:
        fields["image"] = images
    if prompt.system:
        fields["system_prompt"] = prompt.system
    if prompt.templated:
        fields["apply_chat_template"] = False
    if stream:
        fields["stream"] = True
    if sampling:
        fields["sampling_parameters"] = json.dumps(sampling)
    for name in ADDITIONAL_OUTPUTS:
        fields[name] = True
    return fields


# ---- Triton -> responses -------------------------------------------------------------------------
def finish_reason(value) -> str | None:
    return None if value in (None, "", "None") else str(value)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def completion(model: str, outputs: dict) -> dict:
    return {
        "id": completion_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": outputs.get("text_output", "")},
                "logprobs": None,
                "finish_reason": finish_reason(outputs.get("finish_reason")) or "stop",
            }
        ],
        "usage": usage(
            int(outputs.get("num_input_tokens", 0)), int(outputs.get("num_output_tokens", 0))
        ),
    }


@dataclass
class ChunkStream:
    """Builds the chat.completion.chunk bodies of one streamed answer."""

    model: str
    include_usage: bool = False
    id: str = field(default_factory=completion_id)
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def _chunk(self, delta: dict, finish: str | None) -> dict:
        body = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self.include_usage:
            body["usage"] = None
        return body

    def first(self) -> dict:
        return self._chunk({"role": "assistant", "content": ""}, None)

    def reply(self, outputs: dict) -> list[dict]:
        """One Triton response -> its chunks (a content delta, and the finish chunk)."""
        self.prompt_tokens = int(outputs.get("num_input_tokens", self.prompt_tokens))
        self.completion_tokens += int(outputs.get("num_output_tokens", 0))
        chunks = []
        text = outputs.get("text_output", "")
        if text:
            chunks.append(self._chunk({"content": text}, None))
        finish = finish_reason(outputs.get("finish_reason"))
        if finish:
            chunks.append(self._chunk({}, finish))
        return chunks

    def usage_chunk(self) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage(self.prompt_tokens, self.completion_tokens),
        }
