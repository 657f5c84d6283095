"""/v1/audio/transcriptions and /v1/audio/translations: a multipart form -> whisper_lora
(lora_openai.audio parses and renders) -> every response_format, or transcript.text.delta /
transcript.text.done events."""

import asyncio
import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.datastructures import UploadFile

from lora_openai import audio
from lora_openai.errors import bad_request
from lora_openai.front import admit, front_of
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


@router.post("/v1/audio/transcriptions")
async def transcriptions(request: Request):
    return await speech(request, "transcribe")


@router.post("/v1/audio/translations")
async def translations(request: Request):
    return await speech(request, "translate")


async def speech(request: Request, task: str) -> Response:
    front = front_of(request)
    form = await request.form(max_files=1, max_fields=100)
    items, audio_bytes = [], None
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            if name != "file":
                raise bad_request(f"unexpected file in form field '{name}'", name)
            audio_bytes = await value.read()
        else:
            items.append((name, value))
    parsed = audio.parse_form(task, items, audio_bytes)
    caller, model = await admit(request, parsed.model, "audio")
    seconds = await asyncio.to_thread(audio.audio_duration, parsed.audio)
    if caller.key is not None:
        front.tenancy.limits.audio(caller.key, seconds or 0.0)
    front.tenancy.usage.audio(caller.name, model.id, seconds or 0.0)
    replies = scoped(
        front.gateway.stream(model.triton_model, parsed.triton_fields(), model.parameters),
        front.catalog,
        model,
        caller,
    )
    log.info("%s key=%s model=%s format=%s", task, caller.name, model.id, parsed.response_format)
    if not parsed.stream:
        outputs = await final_outputs(request, replies)
        media_type, body = audio.render(parsed, outputs)
        if isinstance(body, dict):
            return JSONResponse(body)
        return PlainTextResponse(body, media_type=media_type)
    first = await until_disconnected(request, next_reply(replies))

    async def events():
        sent = ""
        reply = first
        while reply is not None:
            text = reply.outputs.get("text_output", "")
            if not reply.final:
                sent += text
                if text:
                    yield sse(audio.delta_event(text))
            else:  # whisper_lora's final response carries the whole text
                if text.startswith(sent) and len(text) > len(sent):
                    yield sse(audio.delta_event(text[len(sent) :]))
                yield sse(audio.done_event(text))
                return
            reply = await next_reply(replies)
        yield sse(audio.done_event(sent))

    return event_stream(events(), replies)
