"""Small tritonclient helpers for the end-to-end tests (gRPC streams, HTTP, concurrent sends)."""

import json
import queue
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


@dataclass
class Outcome:
    outputs: dict[str, list] | None  # final outputs, one value per batch row
    error: str | None
    partials: list[str]  # text_output of the responses before the final one (streaming)

    @property
    def text(self) -> str:
        assert self.error is None, self.error
        return self.outputs["text_output"][0]


def tensor(module, name: str, value) -> object:
    """A [1, ...] input from a python value (str/bytes -> BYTES, bool, int -> INT32, arrays)."""
    if isinstance(value, np.ndarray):
        data = value if value.ndim > 1 else value[None, :]
    elif isinstance(value, list):
        data = np.array(
            [[v if isinstance(v, bytes) else str(v).encode() for v in value]], dtype=np.object_
        )
    elif isinstance(value, (str, bytes)):
        data = np.array([[value if isinstance(value, bytes) else value.encode()]], dtype=np.object_)
    elif isinstance(value, bool):
        data = np.array([[value]], dtype=np.bool_)
    elif isinstance(value, int):
        data = np.array([[value]], dtype=np.int32)
    else:
        raise TypeError(f"no tensor for {type(value)}")
    datatype = {
        np.object_: "BYTES",
        np.bool_: "BOOL",
        np.int32: "INT32",
        np.float32: "FP32",
        np.float64: "FP64",
        np.int64: "INT64",
        np.uint8: "UINT8",
    }[data.dtype.type]
    item = module.InferInput(name, list(data.shape), datatype)
    item.set_data_from_numpy(data)
    return item


def sampling(**params) -> str:
    return json.dumps(params)


def _values(result, name: str) -> list:
    values = result.as_numpy(name)
    return [
        v.decode("utf-8", "replace") if isinstance(v, bytes) else v.item()
        for v in values.reshape(values.shape[0], -1)[:, 0]
    ]


def grpc_one(
    url: str, model: str, inputs: dict, parameters: dict | None = None, timeout_s: float = 600
) -> Outcome:
    """One request on its own gRPC stream; collects every response until the final one."""
    client = grpcclient.InferenceServerClient(url)
    replies: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    partials = []
    try:
        client.async_stream_infer(
            model,
            [tensor(grpcclient, name, value) for name, value in inputs.items()],
            parameters=parameters,
            enable_empty_final_response=True,
        )
        while True:
            result, error = replies.get(timeout=timeout_s)
            if error is not None:
                return Outcome(None, str(error), partials)
            response = result.get_response()
            outputs = {out.name: _values(result, out.name) for out in response.outputs}
            if response.parameters["triton_final_response"].bool_param:
                return Outcome(outputs, None, partials)
            partials.append(outputs["text_output"][0])
    finally:
        client.stop_stream()
        client.close()


def grpc_many(url: str, model: str, requests: list[tuple[dict, dict | None]]) -> list[Outcome]:
    """Send all requests at the same time (one stream each) so Triton and vLLM batch them."""
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        futures = [
            pool.submit(grpc_one, url, model, inputs, parameters) for inputs, parameters in requests
        ]
        return [future.result() for future in futures]


def http_one(url: str, model: str, inputs: dict, parameters: dict | None = None) -> Outcome:
    client = httpclient.InferenceServerClient(url, network_timeout=600)
    try:
        result = client.infer(
            model, [tensor(httpclient, n, v) for n, v in inputs.items()], parameters=parameters
        )
    except Exception as err:  # tritonclient raises InferenceServerException
        return Outcome(None, str(err), [])
    finally:
        client.close()
    names = [output["name"] for output in result.get_response()["outputs"]]
    return Outcome({name: _values(result, name) for name in names}, None, [])
