"""The front's only way to Triton: tritonclient.grpc.aio on one channel.

Every request is one bidirectional gRPC stream (both models are decoupled). A complete request
ends its stream as tritonclient's own stream does: half-closed after the final response, then
read to its end. Leaving the `stream()` generator early (a client that disconnected, a
`break`) cancels the gRPC call instead, and Triton cancels the request inside the model: its
engine work stops.
"""

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from lora_client.requests import infer_inputs

from lora_openai.errors import OpenAIError, from_triton


@dataclass
class Reply:
    """One Triton response: output name -> first batch row's value (str, number or bool)."""

    outputs: dict
    final: bool


def _reply(result) -> Reply:
    response = result.get_response()
    outputs = {}
    for output in response.outputs:
        values = result.as_numpy(output.name)
        if values is None or values.size == 0:
            continue
        value = values.reshape(values.shape[0], -1)[0, 0]
        outputs[output.name] = (
            value.decode("utf-8", "replace") if isinstance(value, bytes) else value.item()
        )
    final = response.parameters["triton_final_response"].bool_param
    return Reply(outputs, final)


def _unreachable(url: str, err: grpc.aio.AioRpcError) -> OpenAIError:
    if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return OpenAIError(
            503, f"Triton at {url} is not reachable: {err.details()}", code="triton_unavailable"
        )
    if err.code() == grpc.StatusCode.CANCELLED:
        return OpenAIError(499, "request cancelled", code="cancelled")
    return from_triton(err.details() or str(err))


async def _drain(call, timeout_s: float = 5.0) -> None:
    """Read a finished stream to its end (Triton closes it after the half-close)."""
    try:
        async with asyncio.timeout(timeout_s):
            async for _ in call:
                pass
    except (TimeoutError, grpc.aio.AioRpcError):
        call.cancel()
    except asyncio.CancelledError:
        call.cancel()
        raise


class TritonGateway:
    """Async gRPC client of one tritonserver; `close()` when the app stops."""

    def __init__(self, url: str):
        self.url = url
        self._client = aioclient.InferenceServerClient(url)

    async def close(self) -> None:
        await self._client.close()

    async def server_ready(self) -> bool:
        try:
            return await self._client.is_server_ready(client_timeout=2)
        except Exception:
            return False

    async def model_ready(self, model: str) -> bool:
        try:
            return await self._client.is_model_ready(model, client_timeout=2)
        except Exception:
            return False

    async def stream(
        self, model: str, fields: dict, parameters: dict | None = None
    ) -> AsyncIterator[Reply]:
        """Yield every response to one request, the last one marked final. A Triton error
        raises OpenAIError; closing the generator early cancels the request on the server."""
        request = {"model_name": model, "inputs": infer_inputs(grpcclient, fields)}
        if parameters:
            request["parameters"] = parameters

        final_seen = asyncio.Event()

        async def requests():
            yield request
            # Half-close the stream only once the request is complete, as tritonclient's
            # stop_stream() does: then Triton ends the stream itself, with nothing to cancel.
            await final_seen.wait()

        call = self._client.stream_infer(requests())
        complete = False
        try:
            async for result, error in call:
                if error is not None:  # an error response is the request's last
                    complete = True
                    raise from_triton(str(error.message()))
                reply = _reply(result)
                complete = reply.final
                yield reply
                if complete:
                    return
        except grpc.aio.AioRpcError as err:
            raise _unreachable(self.url, err) from None
        finally:
            final_seen.set()
            if complete:
                await _drain(call)
            else:  # left early (client gone, error): Triton cancels the request
                call.cancel()

    async def complete(self, model: str, fields: dict, parameters: dict | None = None) -> Reply:
        """Send one request and return its final response (outputs of non-final responses are
        merged in, so a final response without outputs still carries the last values)."""
        outputs: dict = {}
        async for reply in self.stream(model, fields, parameters):
            outputs.update(reply.outputs)
        return Reply(outputs, True)

    async def adapter_names(self, model: str) -> list[str]:
        """The adapters `model` serves now (its `adapter_command` "list" answer)."""
        reply = await self.complete(model, {"adapter_command": "list"})
        listing = json.loads(reply.outputs.get("text_output") or "{}")
        return sorted(item["name"] for item in listing.get("adapters", []))
