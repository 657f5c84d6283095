"""Request body size limit as pure ASGI middleware: 413 in OpenAI's error shape.

A declared Content-Length over the limit is refused before anything is read; a chunked body is
counted as it arrives: reading past the limit raises OpenAIError(413) inside the handler that
reads it (the app's error handler answers it), so nothing beyond the limit is buffered.
"""

import json

from lora_openai.errors import OpenAIError


async def send_error(send, error: OpenAIError) -> None:
    body = json.dumps(error.body()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodySizeLimit:
    def __init__(self, app, *, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _error(self) -> OpenAIError:
        return OpenAIError(
            413,
            f"request body is over this server's {self.max_bytes} byte limit "
            "(lora-openai --max-body-mb)",
            code="request_too_large",
        )

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await send_error(send, self._error())
        seen = 0
        started = False

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise self._error()
            return message

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except OpenAIError as err:  # raised outside the app's handlers (they answer it)
            if started or err.status != 413:
                raise
            await send_error(send, err)
