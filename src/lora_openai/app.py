"""The FastAPI app: the routers of lora_openai.routers on one FastAPI, as Triton's openai_frontend
assembles its own (frontend/fastapi_frontend.py).

`create_app(settings, gateway_factory=...)` builds it; the gateway (lora_openai.triton.
TritonGateway unless a test passes another), the model catalog and the load reader are created
when the app starts and closed when it stops, on the app's `Front` (lora_openai.front). Errors
of every route leave as OpenAI's error body. `build` adds the key check and the body size limit
in front of it: what uvicorn serves.
"""

import asyncio
import logging
from collections.abc import Callable

import anyio
import fastapi.routing
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lora_openai.auth import ApiKeyAuth, Tenancy
from lora_openai.engine_load import TritonLoadReader
from lora_openai.errors import OpenAIError
from lora_openai.front import Front, FrontSettings, MiB
from lora_openai.limits import BodySizeLimit
from lora_openai.models import ModelCatalog
from lora_openai.realtime import vad as realtime_vad
from lora_openai.routers import ROUTERS
from lora_openai.triton import TritonGateway

__all__ = ["FrontSettings", "MiB", "build", "create_app"]
log = logging.getLogger("lora_openai")


def create_app(
    settings: FrontSettings,
    gateway_factory: Callable[[str], TritonGateway] = TritonGateway,
    load_reader_factory: Callable[[str], TritonLoadReader] = TritonLoadReader,
    tenancy: Tenancy | None = None,
) -> FastAPI:
    front = Front(settings, tenancy or Tenancy())

    async def lifespan(app):
        # Starlette's streamed responses run in an anyio task group, whose asyncio backend is
        # imported on first use: done on the first streamed answer, with the engine busy, the
        # import held that answer's first events back for seconds.
        async with anyio.create_task_group():
            pass
        await asyncio.to_thread(_read_endpoint_sources, app)
        await asyncio.to_thread(realtime_vad.load)  # not on a live session's first frame
        front.gateway = gateway_factory(settings.triton_url)
        front.catalog = ModelCatalog(front.gateway, ttl_s=settings.models_ttl_s)
        front.load = load_reader_factory(settings.triton_metrics_url)
        try:
            yield
        finally:
            await front.load.close()
            await front.gateway.close()

    app = FastAPI(title="lora-serving OpenAI API", lifespan=lifespan)
    app.state.front = front
    for router in ROUTERS:
        app.include_router(router)
    _answer_errors_as_openai(app)
    return app


def _answer_errors_as_openai(app: FastAPI) -> None:
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
