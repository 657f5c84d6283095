"""/health (Triton's readiness) and /metrics: the engines' load in the endpoint picker's protocol
(lora_openai.picker_metrics, read from Triton's metrics endpoint by lora_openai.engine_load),
then the per-key usage."""

from fastapi import APIRouter, Request
from fastapi.responses import Response

from lora_openai import picker_metrics
from lora_openai.errors import OpenAIError
from lora_openai.front import front_of

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    front = front_of(request)
    if await front.gateway.server_ready():
        return {"status": "ok"}
    raise OpenAIError(503, f"Triton at {front.settings.triton_url} is not ready", code="not_ready")


@router.get("/metrics")
async def metrics(request: Request):
    """The engines' load in the endpoint picker's protocol (llm-d Router / Gateway API
    Inference Extension); 503 while Triton's metrics cannot be read."""
    front = front_of(request)
    snapshot = await front.load.read()
    body = picker_metrics.render(snapshot.load, snapshot.read_at) + front.tenancy.usage.render()
    return Response(body, media_type=picker_metrics.CONTENT_TYPE)
