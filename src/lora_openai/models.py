"""Model ids: `whisper_lora`, `qwen_vl_lora`, and `<triton model>/<adapter>` for adapters.

The listing is live: each model's adapters come from its `adapter_command` "list" answer,
cached for `ttl_s` (so /v1/models follows the fleet's rescans), and an id that is not in the
cache triggers one fresh listing before it is refused (an adapter added a moment ago works).
"""

import asyncio
import time
from dataclasses import dataclass

from lora_openai.errors import OpenAIError, bad_request, unknown_model
from lora_openai.keys import EVERYTHING, Scope
from lora_openai.triton import TritonGateway

# Triton model -> what it serves (the endpoint family that accepts it).
BASE_MODELS = {"whisper_lora": "audio", "qwen_vl_lora": "chat"}
SEPARATOR = "/"
OWNER = "lora-serving"


@dataclass(frozen=True)
class ModelId:
    triton_model: str
    adapter: str | None

    @property
    def id(self) -> str:
        return self.triton_model + (f"{SEPARATOR}{self.adapter}" if self.adapter else "")

    @property
    def parameters(self) -> dict | None:
        """Triton request parameters naming the adapter (None: the base model)."""
        return {"lora_name": self.adapter} if self.adapter else None


def parse_model_id(model: str) -> ModelId:
    """`whisper_lora` or `whisper_lora/alpha` -> ModelId; only the syntax is checked here."""
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required", param="model")
    base, sep, adapter = model.partition(SEPARATOR)
    if sep and not adapter:
        raise bad_request(f"model '{model}' names no adapter after '{SEPARATOR}'", "model")
    return ModelId(base, adapter or None)


@dataclass(frozen=True)
class Listing:
    # ready Triton model -> its adapters; None: the model answered no listing (its adapter
    # control is off), so its adapters are not listed and requests name them unchecked.
    adapters: dict[str, list[str] | None]
    taken_at: float

    def ids(self, scope: Scope = EVERYTHING) -> list[str]:
        """The served ids the caller with `scope` may see."""
        ids = (
            ModelId(model, adapter).id
            for model, names in self.adapters.items()
            for adapter in [None, *(names or [])]
        )
        return [model_id for model_id in ids if scope.allows(model_id)]

    def serves(self, wanted: ModelId) -> bool:
        names = self.adapters.get(wanted.triton_model, [])
        return wanted.adapter is None or names is None or wanted.adapter in names


class ModelCatalog:
    def __init__(self, gateway: TritonGateway, *, ttl_s: float = 1.0, clock=time.monotonic):
        self.gateway = gateway
        self.ttl_s = ttl_s
        self._clock = clock
        self._listing: Listing | None = None
        self._lock = asyncio.Lock()

    async def listing(self, *, fresh: bool = False) -> Listing:
        async with self._lock:  # one listing round at a time; waiters reuse its result
            now = self._clock()
            if fresh or self._listing is None or now - self._listing.taken_at > self.ttl_s:
                self._listing = await self._take(now)
            return self._listing

    async def _take(self, now: float) -> Listing:
        ready = await asyncio.gather(*(self.gateway.model_ready(m) for m in BASE_MODELS))
        models = [m for m, ok in zip(BASE_MODELS, ready, strict=True) if ok]
        if not models and not await self.gateway.server_ready():
            raise OpenAIError(
                503, f"Triton at {self.gateway.url} is not ready", code="triton_unavailable"
            )
        answers = await asyncio.gather(
            *(self.gateway.adapter_names(m) for m in models), return_exceptions=True
        )
        adapters = {}
        for model, answer in zip(models, answers, strict=True):
            # A model that answers no listing (control off) still serves; Triton checks names.
            adapters[model] = None if isinstance(answer, BaseException) else answer
        return Listing(adapters, now)

    async def not_found(self, model: str, scope: Scope) -> OpenAIError:
        """The 404 for `model`, naming only ids in the caller's scope: an id outside it gets
        exactly the answer of an id that does not exist."""
        try:
            listing = await self.listing()
        except OpenAIError:
            return unknown_model(model, [])
        return unknown_model(model, listing.ids(scope))

    async def resolve(self, model: str, family: str, scope: Scope = EVERYTHING) -> ModelId:
        """The ModelId for a request to an endpoint of `family` ("audio" | "chat"):
        404 for an id nobody serves or outside the caller's `scope`, 400 for a model of the
        other family, 503 when the Triton model exists but is not ready."""
        wanted = parse_model_id(model)
        if wanted.triton_model not in BASE_MODELS or not scope.allows(wanted.id):
            raise await self.not_found(model, scope)
        if BASE_MODELS[wanted.triton_model] != family:
            raise bad_request(
                f"model '{model}' does not serve this endpoint; use one of the "
                f"{family} models: {', '.join(m for m, f in BASE_MODELS.items() if f == family)}",
                "model",
            )
        listing = await self.listing()
        if wanted.triton_model not in listing.adapters or not listing.serves(wanted):
            listing = await self.listing(fresh=True)
        if wanted.triton_model not in listing.adapters:
            raise OpenAIError(
                503, f"model '{wanted.triton_model}' is not ready on Triton", code="model_not_ready"
            )
        if not listing.serves(wanted):
            raise unknown_model(model, listing.ids(scope))
        return wanted

    async def openai_list(self, scope: Scope = EVERYTHING) -> dict:
        listing = await self.listing()
        created = int(time.time())
        data = []
        for model_id in listing.ids(scope):
            parsed = parse_model_id(model_id)
            data.append(
                {
                    "id": model_id,
                    "object": "model",
                    "created": created,
                    "owned_by": OWNER,
                    "root": parsed.triton_model,
                    "parent": parsed.triton_model if parsed.adapter else None,
                }
            )
        return {"object": "list", "data": data}
