"""GET /v1/realtime (WebSocket): live transcription in vLLM's realtime protocol, or in OpenAI's
transcription session with `?intent=transcription` (lora_openai.realtime.events).

The key was checked on the handshake (lora_openai.auth); the session's model is resolved with
the caller's scope exactly as a file upload's (an unknown id and one outside the scope get the
same error event). Each socket is one LiveSession; when the socket closes, its decodes are
cancelled.
"""

import asyncio
import json
import logging
import time

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from lora_openai.auth import caller_of, note_model
from lora_openai.errors import OpenAIError
from lora_openai.front import Front, FrontSettings
from lora_openai.models import ModelId
from lora_openai.realtime import events
from lora_openai.realtime.events import OPENAI, VLLM, ProtocolError, SessionConfig
from lora_openai.realtime.session import DecodeBudget, LiveSession, RealtimeLimits, SessionOver
from lora_openai.realtime.transcribe import as_protocol_error, transcribe

log = logging.getLogger("lora_openai")
router = APIRouter()


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket):
    front: Front = websocket.app.state.front
    protocol = OPENAI if websocket.query_params.get("intent") == "transcription" else VLLM
    await websocket.accept()
    connection = _Connection(front, websocket, protocol)
    try:
        await connection.run()
    finally:
        await connection.close()


def budget_of(websocket: WebSocket, settings: FrontSettings) -> DecodeBudget:
    """The app's one DecodeBudget, shared by its sessions."""
    state = websocket.app.state
    if getattr(state, "realtime_budget", None) is None:
        state.realtime_budget = DecodeBudget(settings.realtime_max_partial_decodes)
    return state.realtime_budget


def limits_of(settings: FrontSettings) -> RealtimeLimits:
    return RealtimeLimits(
        max_session_s=settings.realtime_max_session_s,
        max_turn_s=settings.realtime_max_turn_s,
        idle_timeout_s=settings.realtime_idle_timeout_s,
    )


class _Connection:
    def __init__(self, front: Front, websocket: WebSocket, protocol: str):
        self.front = front
        self.websocket = websocket
        self.protocol = protocol
        self.caller = caller_of(websocket)
        self.model: ModelId | None = None
        config = events.VLLM_SESSION if protocol == VLLM else SessionConfig()
        self.session = LiveSession(
            protocol,
            config,
            self.send,
            self._transcribe,
            limits_of(front.settings),
            budget_of(websocket, front.settings),
        )

    async def send(self, event: dict) -> None:
        if self.websocket.application_state == WebSocketState.CONNECTED:
            await self.websocket.send_text(json.dumps(event, ensure_ascii=False))

    async def _transcribe(
        self, pcm: bytes, rate: int, config: SessionConfig, final: bool, *, prefix=None
    ) -> str:
        if self.model is None:
            raise ProtocolError(
                "no model: send session.update with the transcription model first",
                "model_not_validated",
                "model",
            )
        return await transcribe(
            self.front, self.caller, self.model, pcm, rate, config, final, prefix=prefix
        )

    async def run(self) -> None:
        await self.send(self._created())
        given = self.websocket.query_params.get("model")
        if given and self.protocol == OPENAI:  # the SDK's connect(model=...)
            await self._use_model(given, None)
        idle_s = self.session.limits.idle_timeout_s
        while True:
            try:
                async with asyncio.timeout(idle_s):
                    message = await self.websocket.receive()
            except TimeoutError:
                await self._close_with_error(
                    f"no event for {idle_s:g} s (limit realtime_idle_timeout_s)", "idle_timeout"
                )
                return
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text") if message.get("text") is not None else message.get("bytes")
            try:
                await self._handle(text)
            except ProtocolError as err:
                await self.send(events.error_event(self.protocol, err))
            except SessionOver as over:
                await self._close_with_error(str(over), "session_limit")
                return

    async def _handle(self, text) -> None:
        event, event_id = events.parse(text, self.protocol, self.session.config)
        if isinstance(event, events.Update):
            model = event.config.transcription.model
            if model and not await self._use_model(model, event_id):
                return  # the error event is sent; the session keeps its settings
            self.session.reconfigure(event.config)
            if self.protocol == OPENAI:
                await self.send(
                    events.openai_event("session.updated", session=self.session.config.openai())
                )
        elif isinstance(event, events.Append):
            await self.session.append(event.pcm)
        elif isinstance(event, events.Commit):
            if self.protocol == VLLM and self.model is None:
                raise ProtocolError(
                    "Model not validated: send session.update with a model first",
                    "model_not_validated",
                    event_id=event_id,
                )
            await self.session.commit(final=event.final)
        elif isinstance(event, events.Clear):
            await self.session.clear()

    async def _use_model(self, model: str, event_id) -> bool:
        try:
            resolved = await self.front.catalog.resolve(model, "audio", self.caller.scope)
        except OpenAIError as err:
            error = as_protocol_error(err)
            error.event_id = event_id
            await self.send(events.error_event(self.protocol, error))
            return False
        self.model = resolved
        note_model(self.websocket, resolved.id)
        log.info("realtime %s key=%s model=%s", self.protocol, self.caller.name, resolved.id)
        return True

    def _created(self) -> dict:
        if self.protocol == VLLM:
            return {
                "type": "session.created",
                "id": events.new_id("sess"),
                "created": int(time.time()),
            }
        return events.openai_event("session.created", session=self.session.config.openai())

    async def _close_with_error(self, message: str, code: str) -> None:
        await self.send(events.error_event(self.protocol, ProtocolError(message, code)))
        if self.websocket.application_state == WebSocketState.CONNECTED:
            await self.websocket.close(code=1008, reason=code)

    async def close(self) -> None:
        await self.session.close()
        if self.websocket.application_state == WebSocketState.CONNECTED:
            try:
                await self.websocket.close()
            except (RuntimeError, WebSocketDisconnect):
                pass
