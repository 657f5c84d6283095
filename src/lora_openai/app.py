"""The FastAPI app: thin routes (parse -> Triton over gRPC -> OpenAI body or server-sent events).

`create_app(settings, gateway=...)` builds it; the gateway (lora_openai.triton.TritonGateway
unless a test passes another) is created when the app starts and closed when it stops. More
routes are added the same way: a function registered on the app. `/metrics` serves the
engines' load in the endpoint picker's protocol (lora_openai.picker_metrics), read from
Triton's metrics endpoint (lora_openai.engine_load).
"""

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import fastapi.routing
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from lora_openai import admin, audio, chat, picker_metrics
from lora_openai.auth import ApiKeyAuth, Caller, Tenancy, caller_of, note_model
from lora_openai.engine_load import TritonLoadReader
from lora_openai.errors import OpenAIError, bad_request
from lora_openai.limits import BodySizeLimit
from lora_openai.models import ModelCatalog, ModelId
from lora_openai.triton import TritonGateway

log = logging.getLogger("lora_openai")
MiB = 1024 * 1024


@dataclass(frozen=True)
class FrontSettings:
    triton_url: str = "127.0.0.1:8001"
    triton_metrics_url: str = "http://127.0.0.1:8002/metrics"  # read for our /metrics
    max_body_bytes: int = 25 * MiB  # OpenAI's own audio upload limit
    allow_image_urls: bool = False  # fetch http(s) image_url parts (off: data URLs only)
    image_fetch_timeout_s: float = 10.0
    models_ttl_s: float = 1.0
    api_key: str | None = None  # --api-key: one key, every model, admin (vLLM's flag)
    api_keys_file: Path | None = None  # --api-keys-file: named keys, scopes, limits (keys.py)
    open_metrics: bool = False  # --open-metrics: /metrics needs no admin key even with keys
    # Sent with the admin API's load / unload commands (the models' control token).
    triton_control_token: str | None = None

    def control_parameters(self) -> dict | None:
        token = self.triton_control_token
        return {"control_token": token} if token else None


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


async def _first(stream: AsyncIterator):
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return None


def _event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        events,
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


async def _scoped(replies, catalog: ModelCatalog, model: ModelId, caller: Caller):
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


def _read_endpoint_sources(app: FastAPI) -> None:
    """FastAPI reads each endpoint's source file on the endpoint's first request (to name it in
    error messages; cached after), on the event loop: on a busy machine the first transcription
    held every other request and /metrics scrape back for seconds. Read them before serving."""
    extract = getattr(fastapi.routing, "_extract_endpoint_context", None)
    if extract is None:  # a FastAPI without it has nothing to read
        return
    for route in app.routes:
        if isinstance(route, fastapi.routing.APIRoute) and route.dependant.call is not None:
            extract(route.dependant.call)


def create_app(
    settings: FrontSettings,
    gateway_factory: Callable[[str], TritonGateway] = TritonGateway,
    load_reader_factory: Callable[[str], TritonLoadReader] = TritonLoadReader,
    tenancy: Tenancy | None = None,
) -> FastAPI:
    state: dict = {}
    tenancy = tenancy or Tenancy()

    async def lifespan(app):
        # Starlette's streamed responses run in an anyio task group, whose asyncio backend is
        # imported on first use: done on the first streamed answer, with the engine busy, the
        # import held that answer's first events back for seconds.
        async with anyio.create_task_group():
            pass
        await asyncio.to_thread(_read_endpoint_sources, app)
        gateway = gateway_factory(settings.triton_url)
        state["gateway"] = gateway
        state["catalog"] = ModelCatalog(gateway, ttl_s=settings.models_ttl_s)
        state["load"] = load_reader_factory(settings.triton_metrics_url)
        try:
            yield
        finally:
            await state["load"].close()
            await gateway.close()

    app = FastAPI(title="lora-serving OpenAI API", lifespan=lifespan)
    app.include_router(admin.router(state, settings.control_parameters()))

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, err: OpenAIError):
        if err.status >= 500:
            log.warning("%s %s -> %s: %s", request.method, request.url.path, err.status, err)
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers())

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException):
        return JSONResponse(OpenAIError(err.status_code, str(err.detail)).body(), err.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, err: Exception):
        log.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse(OpenAIError(500, f"internal error: {err!r}").body(), 500)

    @app.get("/health")
    async def health():
        if await state["gateway"].server_ready():
            return {"status": "ok"}
        raise OpenAIError(503, f"Triton at {settings.triton_url} is not ready", code="not_ready")

    @app.get("/metrics")
    async def metrics():
        """The engines' load in the endpoint picker's protocol (llm-d Router / Gateway API
        Inference Extension); 503 while Triton's metrics cannot be read."""
        snapshot = await state["load"].read()
        body = picker_metrics.render(snapshot.load, snapshot.read_at) + tenancy.usage.render()
        return Response(body, media_type=picker_metrics.CONTENT_TYPE)

    @app.get("/v1/models")
    async def list_models(request: Request):
        return await state["catalog"].openai_list(caller_of(request).scope)

    @app.get("/v1/models/{model_id:path}")
    async def get_model(request: Request, model_id: str):
        scope = caller_of(request).scope
        for item in (await state["catalog"].openai_list(scope))["data"]:
            if item["id"] == model_id:
                return item
        raise await state["catalog"].not_found(model_id, scope)

    async def admit(request: Request, model: str, family: str) -> tuple[Caller, ModelId]:
        """The caller and the model it names, if the model is in its scope (404 otherwise)."""
        caller = caller_of(request)
        resolved = await state["catalog"].resolve(model, family, caller.scope)
        note_model(request, resolved.id)
        return caller, resolved

    async def speech(request: Request, task: str) -> Response:
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
            tenancy.limits.audio(caller.key, seconds or 0.0)
        tenancy.usage.audio(caller.name, model.id, seconds or 0.0)
        replies = _scoped(
            state["gateway"].stream(model.triton_model, parsed.triton_fields(), model.parameters),
            state["catalog"],
            model,
            caller,
        )
        log.info(
            "%s key=%s model=%s format=%s", task, caller.name, model.id, parsed.response_format
        )
        if not parsed.stream:
            outputs = await final_outputs(request, replies)
            media_type, body = audio.render(parsed, outputs)
            if isinstance(body, dict):
                return JSONResponse(body)
            return PlainTextResponse(body, media_type=media_type)
        first = await until_disconnected(request, _first(replies))

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
                reply = await _first(replies)
            yield sse(audio.done_event(sent))

        return _event_stream(_errors_as_events(events(), replies))

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request):
        return await speech(request, "transcribe")

    @app.post("/v1/audio/translations")
    async def translations(request: Request):
        return await speech(request, "translate")

    async def load_images(urls: list[str]) -> list[bytes]:
        images = []
        for index, url in enumerate(urls):
            if chat.is_remote(url):
                images.append(await fetch_image(url, index))
            else:
                images.append(chat.decode_image_url(url, index, settings.max_body_bytes))
        return images

    async def fetch_image(url: str, index: int) -> bytes:
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

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        try:
            body = await request.json()
        except ValueError:
            raise bad_request("the request body is not valid JSON") from None
        parsed = chat.parse_request(body)
        caller, model = await admit(request, parsed.model, "chat")
        prompt = chat.build_prompt(parsed.messages)
        sampling = chat.sampling_parameters(parsed)
        images = await load_images(prompt.image_urls)
        fields = chat.triton_fields(prompt, images, sampling, stream=parsed.stream)
        replies = _scoped(
            state["gateway"].stream(model.triton_model, fields, model.parameters),
            state["catalog"],
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
            tenancy.usage.tokens(caller.name, model.id, prompt_tokens, completion_tokens)
            if caller.key is not None:
                tenancy.limits.tokens(caller.key, prompt_tokens + completion_tokens)

        if not parsed.stream:
            outputs = await final_outputs(request, replies)
            answer = chat.completion(model.id, outputs)
            used(answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"])
            return JSONResponse(answer)
        include_usage = bool((parsed.stream_options or {}).get("include_usage"))
        chunks = chat.ChunkStream(model.id, include_usage=include_usage)
        first = await until_disconnected(request, _first(replies))

        async def events():
            yield sse(chunks.first())
            reply = first
            while reply is not None:
                for chunk in chunks.reply(reply.outputs):
                    yield sse(chunk)
                if reply.final:
                    break
                reply = await _first(replies)
            used(chunks.prompt_tokens, chunks.completion_tokens)
            if include_usage:
                yield sse(chunks.usage_chunk())
            yield sse("[DONE]")

        return _event_stream(_errors_as_events(events(), replies))

    return app


def build(settings: FrontSettings) -> ApiKeyAuth:
    """The ASGI application uvicorn serves: keys checked first (a refused caller costs no body
    read), then the body size limit, then the app."""
    tenancy = Tenancy(
        api_key=settings.api_key,
        api_keys_file=settings.api_keys_file,
        open_metrics=settings.open_metrics,
    )
    log.info("lora-openai: %s", tenancy.describe())
    app = create_app(settings, tenancy=tenancy)
    return ApiKeyAuth(BodySizeLimit(app, max_bytes=settings.max_body_bytes), tenancy)
