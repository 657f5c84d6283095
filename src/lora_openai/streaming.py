"""Triton's replies -> an answer: whole (cancelled if the client leaves) or server-sent events.

Shared by the audio and chat routes: a stream's status is sent with its first byte, so a later
error becomes an error event; however a stream ends, its Triton request's stream is closed.
"""

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable

from fastapi import Request
from fastapi.responses import StreamingResponse

from lora_openai.auth import Caller
from lora_openai.errors import OpenAIError
from lora_openai.models import ModelCatalog, ModelId

log = logging.getLogger("lora_openai")


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


async def final_outputs(request: Request, replies) -> dict:
    """A request's outputs once Triton has answered it whole (cancelled if the client leaves)."""
    outputs: dict = {}

    async def collect():
        async for reply in replies:
            outputs.update(reply.outputs)

    await until_disconnected(request, collect())
    return outputs


async def until_disconnected(request: Request, work: Awaitable):
    """Await `work` unless the client goes away first; then cancel it (its Triton request is
    cancelled with it) and raise OpenAIError 499. The body must already have been read."""
    task = asyncio.ensure_future(work)

    async def disconnected():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        log.info("client disconnected: request cancelled")
        raise OpenAIError(499, "client disconnected", code="cancelled")
    return task.result()


async def next_reply(stream: AsyncIterator):
    """The stream's next reply, None at its end."""
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return None


def event_stream(events: AsyncIterator[str], replies) -> StreamingResponse:
    return StreamingResponse(
        _errors_as_events(events, replies),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _errors_as_events(events: AsyncIterator[str], replies) -> AsyncIterator[str]:
    """After the first byte the status is sent: a later error becomes an error event. However
    the stream ends (done, error, client gone), the Triton request's stream is closed."""
    try:
        async for event in events:
            yield event
    except OpenAIError as err:
        log.warning("stream ended with %s: %s", err.status, err.message)
        yield sse(err.body())
    except asyncio.CancelledError:
        log.info("client disconnected: streamed request cancelled")
        raise
    finally:
        await replies.aclose()


async def scoped(replies, catalog: ModelCatalog, model: ModelId, caller: Caller):
    """Triton's replies; an adapter Triton does not know (removed since it was listed) is
    refused as the front refuses unknown ids, naming only the caller's own."""
    try:
        async for reply in replies:
            yield reply
    except OpenAIError as err:
        if err.code == "model_not_found":
            raise await catalog.not_found(model.id, caller.scope) from None
        raise
    finally:
        await replies.aclose()
