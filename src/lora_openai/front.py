"""What every route of the front shares: its settings and what the running app holds.

`create_app` puts one `Front` on `app.state.front`; routes reach it through `front_of(request)`
(as Triton's openai_frontend routes reach `request.app.engine`). The gateway, catalog and load
reader exist from the app's start (its lifespan) to its stop.
"""

from dataclasses import dataclass
from pathlib import Path

from fastapi import Request

from lora_openai.auth import Caller, Tenancy, caller_of, note_model
from lora_openai.engine_load import TritonLoadReader
from lora_openai.models import ModelCatalog, ModelId
from lora_openai.triton import TritonGateway

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
    # /v1/realtime per-session limits (lora_openai.realtime.session.RealtimeLimits).
    realtime_max_session_s: float = 900.0
    realtime_max_turn_s: float = 60.0
    realtime_idle_timeout_s: float = 60.0
    # Partial decodes (previews) in flight across sessions (realtime.session.DecodeBudget).
    realtime_max_partial_decodes: int = 2

    def control_parameters(self) -> dict | None:
        token = self.triton_control_token
        return {"control_token": token} if token else None


@dataclass
class Front:
    settings: FrontSettings
    tenancy: Tenancy
    # Set while the app runs (create_app's lifespan).
    gateway: TritonGateway | None = None
    catalog: ModelCatalog | None = None
    load: TritonLoadReader | None = None


def front_of(request: Request) -> Front:
    return request.app.state.front


async def admit(request: Request, model: str, family: str) -> tuple[Caller, ModelId]:
    """The caller and the model it names, if the model is in its scope (404 otherwise)."""
    caller = caller_of(request)
    resolved = await front_of(request).catalog.resolve(model, family, caller.scope)
    note_model(request, resolved.id)
    return caller, resolved
