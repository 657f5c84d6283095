"""Who is calling: API keys checked before any route runs (pure ASGI middleware).

Paths are sorted into categories once, here, as Triton's openai_frontend does:
  open      /health: no key (probes)
  metrics   /metrics: no key without keys configured; with keys an admin key (it names keys
            and model ids: a tenant must not read the others'), unless --open-metrics
  admin     /v1/load_lora_adapter, /v1/unload_lora_adapter: an admin key (403 for others)
  tenant    everything else: a key (401 without one or with a wrong one)
A request that passes carries its `Caller` in the ASGI scope's state (`caller_of(request)`):
routes use its scope to resolve, list and refuse model ids. Each answered request is counted
per key, model and status (lora_openai.usage), and per-key limits admit it or answer 429
(lora_openai.quotas). Without keys configured every caller is anonymous with every model, as
before keys existed; the admin API then stays shut.
"""

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request

from lora_openai.errors import OpenAIError
from lora_openai.keys import EVERYTHING, KeyEntry, KeyRing, KeysFile, Scope, single_key
from lora_openai.quotas import LimitExceeded, TenantLimits
from lora_openai.usage import ANONYMOUS, NO_KEY, Usage

log = logging.getLogger("lora_openai")
OPEN_PATHS = ("/health",)
METRICS_PATH = "/metrics"
ADMIN_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")


@dataclass(frozen=True)
class Caller:
    key: KeyEntry | None  # None: no keys are configured

    @property
    def name(self) -> str:
        return self.key.name if self.key else ANONYMOUS

    @property
    def scope(self) -> Scope:
        return self.key.scope if self.key else EVERYTHING

    @property
    def admin(self) -> bool:
        return bool(self.key and self.key.admin)


ANONYMOUS_CALLER = Caller(None)


def caller_of(request: Request) -> Caller:
    return request.scope.get("state", {}).get("caller", ANONYMOUS_CALLER)


def note_model(request: Request, model_id: str) -> None:
    """The model id a request uses, once it is known to be in the caller's scope (usage label)."""
    request.scope.setdefault("state", {})["model"] = model_id


class Tenancy:
    """The keys (none, `--api-key` or a re-read keys file), their limits and their usage."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        api_keys_file: Path | None = None,
        open_metrics: bool = False,
    ):
        if api_key and api_keys_file:
            raise ValueError("give --api-key or --api-keys-file, not both")
        self._file = KeysFile(api_keys_file) if api_keys_file else None
        self._ring = single_key(api_key) if api_key else None
        self.limits = TenantLimits()
        self.usage = Usage()
        self.open_metrics = open_metrics  # /metrics without a key even when keys are set

    @property
    def enabled(self) -> bool:
        return self._file is not None or self._ring is not None

    def keys(self) -> KeyRing | None:
        return self._file.current() if self._file else self._ring

    def describe(self) -> str:
        if self._file:
            return f"API keys from {self._file.path} ({len(self._file.ring.entries)} keys)"
        if self._ring:
            return "one API key (--api-key): every model, admin"
        return (
            "no API keys: every caller may use and list every model, and the admin API is off "
            "(lora-openai --api-key / --api-keys-file)"
        )


def _bearer(scope) -> str | None:
    for name, value in scope.get("headers") or []:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


async def _send_error(send, error: OpenAIError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in error.headers().items()),
    ]
    if error.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _deny_websocket(scope, receive, send, error: OpenAIError) -> None:
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        body = json.dumps(error.body()).encode()
        headers = [(b"content-type", b"application/json")]
        if error.status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send(
            {"type": "websocket.http.response.start", "status": error.status, "headers": headers}
        )
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": error.message[:120]})


def _category(path: str) -> str:
    if path in OPEN_PATHS:
        return "open"
    if path == METRICS_PATH:
        return "metrics"
    if path.rstrip("/") in ADMIN_PATHS:
        return "admin"
    return "tenant"


class ApiKeyAuth:
    def __init__(self, app, tenancy: Tenancy):
        self.app = app
        self.tenancy = tenancy

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            return await self._websocket(scope, receive, send)
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        category = _category(scope["path"])
        if category == "open" or (
            category == "metrics" and (self.tenancy.open_metrics or not self.tenancy.enabled)
        ):
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        status = 500

        async def counted_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        caller, refusal = self._caller(scope, category)
        try:
            if refusal is not None:
                await _send_error(counted_send, refusal)
                return
            state["caller"] = caller
            if caller.key is None:
                return await self.app(scope, receive, counted_send)
            try:
                with self.tenancy.limits.request(caller.key):
                    await self.app(scope, receive, counted_send)
            except LimitExceeded as err:
                log.info("key %s: %s", caller.name, err.message)
                await _send_error(counted_send, err)
        finally:
            key = caller.name if caller else NO_KEY
            self.tenancy.usage.request(key, state.get("model", ""), status)

    async def _websocket(self, scope, receive, send):
        """A WebSocket handshake (/v1/realtime) is a tenant request: the key comes as the
        openai SDK sends it (`Authorization: Bearer`); a refusal is the handshake's HTTP answer
        (OpenAI's error body where the server can send one, else a plain 403)."""
        state = scope.setdefault("state", {})
        caller, refusal = self._caller(scope, "tenant")
        try:
            if refusal is None:
                state["caller"] = caller
                if caller.key is None:
                    return await self.app(scope, receive, send)
                with self.tenancy.limits.request(caller.key):
                    return await self.app(scope, receive, send)
        except LimitExceeded as err:
            refusal = err
        log.info("WebSocket %s refused: %s", scope["path"], refusal.message)
        self.tenancy.usage.request(caller.name if caller else NO_KEY, "", refusal.status)
        await _deny_websocket(scope, receive, send, refusal)

    def _caller(self, scope, category: str) -> tuple[Caller | None, OpenAIError | None]:
        """(the caller, None) or (who it is if known, the refusal: 401 for a missing or wrong
        key, 403 on an admin path for a key that is not an admin's or while keys are off)."""
        ring = self.tenancy.keys()
        if ring is None:
            if category == "admin":
                return ANONYMOUS_CALLER, OpenAIError(
                    403,
                    "the admin API needs an admin key: start lora-openai with --api-key or "
                    "--api-keys-file",
                    code="permission_denied",
                )
            return ANONYMOUS_CALLER, None
        token = _bearer(scope)
        entry = ring.find(token) if token else None
        if entry is None:
            return None, OpenAIError(
                401,
                "Incorrect or missing API key: send `Authorization: Bearer <key>`",
                code="invalid_api_key",
            )
        caller = Caller(entry)
        if category == "metrics" and not entry.admin:
            log.info("key %s refused on /metrics: not an admin key", entry.name)
            return caller, OpenAIError(
                403,
                "/metrics needs an admin key (it names every key and model id)",
                code="permission_denied",
            )
        if category == "admin" and not entry.admin:
            log.info("key %s refused on %s: not an admin key", entry.name, scope["path"])
            return caller, OpenAIError(
                403, "this key may not change adapters", code="permission_denied"
            )
        return caller, None
