"""Send requests to our two models over gRPC (tritonclient) or HTTP (Triton's generate API).

A request is a dict of input name -> value (str, bytes, bool, int, a list of str/bytes, or a
numpy array); `infer_inputs` turns it into tritonclient InferInputs with a batch dimension of 1.
Both models are decoupled (they may stream). gRPC goes through tritonclient's bidirectional
stream. Triton's HTTP `infer` endpoint refuses decoupled models, so HTTP uses Triton's generate
extension (`/generate`, and `/generate_stream` with server-sent events): inputs are JSON fields,
binary data (audio files, images) travels as base64, and request parameters such as
`lora_name` go in "parameters".
"""

import base64
import json
import os
import queue
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_DATATYPES = {
    np.object_: "BYTES",
    np.bool_: "BOOL",
    np.int32: "INT32",
    np.float32: "FP32",
    np.float64: "FP64",
    np.int64: "INT64",
    np.uint8: "UINT8",
}


@dataclass
class Reply:
    outputs: dict[str, list]  # output name -> one value per batch row
    final: bool


class RequestError(RuntimeError):
    """The server answered with an error; the message names the problem."""


def as_batch_array(value) -> np.ndarray:
    """A python value -> numpy array with a leading batch dimension of 1."""
    if isinstance(value, np.ndarray):
        return value if value.ndim > 1 else value[None, :]
    if isinstance(value, list):
        return np.array(
            [[v if isinstance(v, bytes) else str(v).encode() for v in value]], dtype=np.object_
        )
    if isinstance(value, (str, bytes)):
        return np.array([[value if isinstance(value, bytes) else value.encode()]], dtype=np.object_)
    if isinstance(value, bool):
        return np.array([[value]], dtype=np.bool_)
    if isinstance(value, int):
        return np.array([[value]], dtype=np.int32)
    raise TypeError(f"cannot send a {type(value).__name__} as a tensor")


def infer_inputs(module, fields: dict) -> list:
    """Request fields -> InferInputs of `module` (tritonclient.grpc or tritonclient.http)."""
    inputs = []
    for name, value in fields.items():
        data = as_batch_array(value)
        item = module.InferInput(name, list(data.shape), _DATATYPES[data.dtype.type])
        item.set_data_from_numpy(data)
        inputs.append(item)
    return inputs


def transcription_fields(
    audio_file: Path | bytes,
    *,
    language=None,
    task=None,
    prompt=None,
    timestamps=False,
    stream=False,
    max_tokens=None,
    decoding: dict | None = None,
) -> dict:
    """whisper_lora inputs; `decoding` adds sampling_parameters keys (e.g. suppress_tokens)."""
    data = audio_file if isinstance(audio_file, bytes) else Path(audio_file).read_bytes()
    fields = {"audio_file": data}
    for name, value in (("language", language), ("task", task), ("prompt", prompt)):
        if value:
            fields[name] = value
    if timestamps:
        fields["timestamps"] = True
    if stream:
        fields["stream"] = True
    params = {**({"max_tokens": max_tokens} if max_tokens else {}), **(decoding or {})}
    if params:
        fields["sampling_parameters"] = json.dumps(params)
    return fields


def vision_fields(
    prompt: str,
    images: list[bytes],
    *,
    video: list[bytes] | None = None,
    video_fps: float | None = None,
    stream=False,
    max_tokens=None,
    system_prompt=None,
) -> dict:
    """qwen_vl_lora inputs: a prompt, encoded images, and optionally one video as its frames."""
    fields = {"text_input": prompt, "exclude_input_in_output": True}
    if images:
        fields["image"] = list(images)
    if video:
        fields["video"] = list(video)
        if video_fps:
            fields["video_fps"] = np.array([[video_fps]], dtype=np.float32)
    if system_prompt:
        fields["system_prompt"] = system_prompt
    if stream:
        fields["stream"] = True
    if max_tokens:
        fields["sampling_parameters"] = json.dumps({"max_tokens": max_tokens})
    return fields


def _json_value(value):
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, np.ndarray):
        return value.reshape(-1).tolist()
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value


def http_generate(
    url: str, model: str, fields: dict, parameters: dict | None = None, *, timeout_s: float = 600
):
    """Yield each response of Triton's generate API as a dict (several when `stream` is set)."""
    body = {name: _json_value(value) for name, value in fields.items()}
    if parameters:
        body["parameters"] = parameters
    endpoint = "generate_stream" if fields.get("stream") else "generate"
    request = urllib.request.Request(
        f"http://{url}/v2/models/{model}/{endpoint}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            if endpoint == "generate":
                yield json.loads(response.read())
                return
            for line in response:
                if line.startswith(b"data: "):
                    event = json.loads(line[len(b"data: ") :])
                    if "error" in event:
                        raise RequestError(event["error"])
                    yield event
    except urllib.error.HTTPError as err:
        detail = err.read().decode("utf-8", "replace")
        try:
            detail = json.loads(detail)["error"]
        except (ValueError, KeyError):
            pass
        raise RequestError(detail) from None


def grpc_stream(
    url: str,
    model: str,
    fields: dict,
    parameters: dict | None = None,
    *,
    timeout_s: float = 600,
    headers: dict | None = None,
):
    """Yield every response of one request sent on its own gRPC stream (`headers`: the stream's
    metadata). Closing the generator before the final response (e.g. `break`) cancels the
    request on the server."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    replies: queue.Queue = queue.Queue()
    client.start_stream(
        callback=lambda result, error: replies.put((result, error)), headers=headers
    )
    ended = False
    try:
        client.async_stream_infer(model, infer_inputs(grpcclient, fields), parameters=parameters)
        while True:
            result, error = replies.get(timeout=timeout_s)
            if error is not None:
                ended = True
                raise RequestError(str(error))
            response = result.get_response()
            outputs = {}
            for output in response.outputs:
                values = result.as_numpy(output.name)
                outputs[output.name] = [
                    v.decode("utf-8", "replace") if isinstance(v, bytes) else v.item()
                    for v in values.reshape(values.shape[0], -1)[:, 0]
                ]
            final = response.parameters["triton_final_response"].bool_param
            ended = final
            yield Reply(outputs, final=final)
            if final:
                return
    finally:
        client.stop_stream(cancel_requests=not ended)
        client.close()


def send(
    url: str,
    protocol: str,
    model: str,
    fields: dict,
    *,
    adapter: str | None = None,
    timeout_s: float = 600,
):
    """Yield the replies to one request, the last one marked final, over either protocol."""
    parameters = {"lora_name": adapter} if adapter else None
    if protocol == "grpc":
        yield from grpc_stream(url, model, fields, parameters, timeout_s=timeout_s)
    elif protocol == "http":
        events = list(http_generate(url, model, fields, parameters, timeout_s=timeout_s))
        for index, event in enumerate(events):
            outputs = {k: [v] for k, v in event.items() if k not in ("model_name", "model_version")}
            yield Reply(outputs, final=index == len(events) - 1)
    else:
        raise ValueError(f"protocol must be grpc or http, got {protocol!r}")


CONTROL_TOKEN_VARIABLE = "LORA_CONTROL_TOKEN"


def control_parameters(token: str | None = None) -> dict | None:
    """Request parameters carrying the adapter control token (default: $LORA_CONTROL_TOKEN)."""
    token = token if token is not None else os.environ.get(CONTROL_TOKEN_VARIABLE)
    return {"control_token": token} if token else None


def adapter_command(
    url: str,
    protocol: str,
    model: str,
    command: str,
    *,
    timeout_s: float = 120,
    token: str | None = None,
) -> dict:
    """Send an adapter command (list | rescan | load NAME [PATH] | unload NAME) to a model and
    return its JSON answer; RequestError carries a refusal's message. `token` (default: the
    environment's $LORA_CONTROL_TOKEN) goes as the `control_token` request parameter: load and
    unload need it where the model names a control token (serving.adapters.control_token_env)."""
    parameters = control_parameters(token)
    fields = {"adapter_command": command}
    if protocol == "grpc":
        replies = list(grpc_stream(url, model, fields, parameters, timeout_s=timeout_s))
        return json.loads(replies[-1].outputs["text_output"][0])
    if protocol == "http":
        events = list(http_generate(url, model, fields, parameters, timeout_s=timeout_s))
        return json.loads(events[-1]["text_output"])
    raise ValueError(f"protocol must be grpc or http, got {protocol!r}")
