"""End-to-end call helpers over the client package (gRPC streams, HTTP generate, concurrency)."""

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from lora_client.requests import RequestError, grpc_stream, http_generate


@dataclass
class Outcome:
    outputs: dict[str, list] | None  # final outputs, one value per batch row
    error: str | None
    partials: list[str]  # text_output of the responses before the final one (streaming)

    @property
    def text(self) -> str:
        assert self.error is None, self.error
        return self.outputs["text_output"][0]


def sampling(**params) -> str:
    return json.dumps(params)


def grpc_one(url: str, model: str, fields: dict, parameters: dict | None = None) -> Outcome:
    partials = []
    try:
        for reply in grpc_stream(url, model, fields, parameters):
            if reply.final:
                return Outcome(reply.outputs, None, partials)
            partials.append(reply.outputs["text_output"][0])
    except RequestError as err:
        return Outcome(None, str(err), partials)
    raise AssertionError("the stream ended without a final response")


def grpc_many(url: str, model: str, requests: list[tuple[dict, dict | None]]) -> list[Outcome]:
    """Send all requests at the same time (one stream each) so Triton and vLLM batch them."""
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        futures = [
            pool.submit(grpc_one, url, model, fields, parameters) for fields, parameters in requests
        ]
        return [future.result() for future in futures]


def http_one(url: str, model: str, fields: dict, parameters: dict | None = None) -> Outcome:
    try:
        events = list(http_generate(url, model, fields, parameters))
    except RequestError as err:
        return Outcome(None, str(err), [])
    final = {name: [value] for name, value in events[-1].items()}
    return Outcome(final, None, [event["text_output"] for event in events[:-1]])
