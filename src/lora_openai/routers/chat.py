"""/v1/chat/completions: messages (text, images as data URLs or, if allowed, fetched URLs) ->
qwen_vl_lora (lora_openai.chat parses and renders) -> a completion, or chunks ending
`data: [DONE]`; tokens counted per key."""

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from lora_openai import chat
from lora_openai.errors import OpenAIError, bad_request
from lora_openai.front import FrontSettings, admit, front_of
from lora_openai.streaming import (
    event_stream,
    final_outputs,
    next_reply,
    scoped,
    sse,
    until_disconnected,
)

log = logging.getLogger("lora_openai")
router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    front = front_of(request)
    try:
        body = await request.json()
    except ValueError:
        raise bad_request("the request body is not valid JSON") from None
    parsed = chat.parse_request(body)
    caller, model = await admit(request, parsed.model, "chat")
    prompt = chat.build_prompt(parsed.messages)
    sampling = chat.sampling_parameters(parsed)
    images = await load_images(front.settings, prompt.image_urls)
    fields = chat.triton_fields(prompt, images, sampling, stream=parsed.stream)
    replies = scoped(
        front.gateway.stream(model.triton_model, fields, model.parameters),
        front.catalog,
        model,
        caller,
    )
    log.info(
        "chat key=%s model=%s stream=%s images=%d",
        caller.name,
        model.id,
        parsed.stream,
        len(images),
    )

    def used(prompt_tokens: int, completion_tokens: int) -> None:
        front.tenancy.usage.tokens(caller.name, model.id, prompt_tokens, completion_tokens)
        if caller.key is not None:
            front.tenancy.limits.tokens(caller.key, prompt_tokens + completion_tokens)

    if not parsed.stream:
        outputs = await final_outputs(request, replies)
        answer = chat.completion(model.id, outputs)
        used(answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"])
        return JSONResponse(answer)
    include_usage = bool((parsed.stream_options or {}).get("include_usage"))
    chunks = chat.ChunkStream(model.id, include_usage=include_usage)
    first = await until_disconnected(request, next_reply(replies))

    async def events():
        yield sse(chunks.first())
        reply = first
        while reply is not None:
            for chunk in chunks.reply(reply.outputs):
                yield sse(chunk)
            if reply.final:
                break
            reply = await next_reply(replies)
        used(chunks.prompt_tokens, chunks.completion_tokens)
        if include_usage:
            yield sse(chunks.usage_chunk())
        yield sse("[DONE]")

    return event_stream(events(), replies)


async def load_images(settings: FrontSettings, urls: list[str]) -> list[bytes]:
    images = []
    for index, url in enumerate(urls):
        if chat.is_remote(url):
            images.append(await fetch_image(settings, url, index))
        else:
            images.append(chat.decode_image_url(url, index, settings.max_body_bytes))
    return images


async def fetch_image(settings: FrontSettings, url: str, index: int) -> bytes:
    if not settings.allow_image_urls:
        raise bad_request(
            f"image {index}: remote image URLs are refused by this server; send the image "
            "as a data URL (data:image/png;base64,...), or start lora-openai with "
            "--allow-image-urls",
            "messages",
        )
    import httpx

    try:
        async with httpx.AsyncClient(timeout=settings.image_fetch_timeout_s) as client:
            async with client.stream("GET", url, follow_redirects=True) as response:
                response.raise_for_status()
                data = bytearray()
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > settings.max_body_bytes:
                        raise OpenAIError(413, f"image {index} at {url} is too large")
                return bytes(data)
    except httpx.HTTPError as err:
        raise bad_request(f"image {index}: could not fetch {url}: {err}", "messages") from None
