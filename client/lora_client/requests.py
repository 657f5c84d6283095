"""Build tritonclient inputs for our two models and run them (gRPC streaming or HTTP).

Both models are decoupled (they may stream), so gRPC goes through a bidirectional stream; HTTP
works for non-streaming requests (Triton answers a decoupled model's single response over HTTP).
"""

import json
import queue
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Reply:
    outputs: dict[str, list]  # output name -> one value per batch row
    final: bool


def string_input(module, name: str, values: list) -> object:
    data = np.array(
        [[v if isinstance(v, bytes) else str(v).encode("utf-8")] for v in values], dtype=np.object_
    )
    tensor = module.InferInput(name, list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    return tensor


def array_input(module, name: str, data: np.ndarray) -> object:
    datatype = {np.float32: "FP32", np.int32: "INT32", np.bool_: "BOOL", np.uint32: "UINT32"}[
        data.dtype.type
    ]
    tensor = module.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return tensor


def transcription_inputs(
    module,
    audio_file: Path | bytes,
    *,
    language=None,
    task=None,
    prompt=None,
    stream=False,
    max_tokens=None,
) -> list:
    data = audio_file if isinstance(audio_file, bytes) else Path(audio_file).read_bytes()
    inputs = [string_input(module, "audio_file", [data])]
    for name, value in (("language", language), ("task", task), ("prompt", prompt)):
        if value:
            inputs.append(string_input(module, name, [value]))
    if stream:
        inputs.append(array_input(module, "stream", np.array([[True]])))
    if max_tokens:
        inputs.append(
            string_input(module, "sampling_parameters", [json.dumps({"max_tokens": max_tokens})])
        )
    return inputs


def vision_inputs(
    module, prompt: str, images: list[bytes], *, stream=False, max_tokens=None, system_prompt=None
) -> list:
    inputs = [
        string_input(module, "text_input", [prompt]),
        array_input(module, "exclude_input_in_output", np.array([[True]])),
    ]
    if images:
        data = np.array([images], dtype=np.object_)
        tensor = module.InferInput("image", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    if system_prompt:
        inputs.append(string_input(module, "system_prompt", [system_prompt]))
    if stream:
        inputs.append(array_input(module, "stream", np.array([[True]])))
    if max_tokens:
        inputs.append(
            string_input(module, "sampling_parameters", [json.dumps({"max_tokens": max_tokens})])
        )
    return inputs


def _decode(result, names) -> dict[str, list]:
    outputs = {}
    for name in names:
        values = result.as_numpy(name)
        if values is None:
            continue
        outputs[name] = [
            v.decode("utf-8") if isinstance(v, bytes) else v.item()
            for v in values.reshape(values.shape[0], -1)[:, 0]
        ]
    return outputs


class TritonModelClient:
    """Sends one request to one model and yields its replies (several when streaming)."""

    def __init__(self, url: str, protocol: str = "grpc"):
        self.protocol = protocol
        if protocol == "grpc":
            import tritonclient.grpc as module
        elif protocol == "http":
            import tritonclient.http as module
        else:
            raise ValueError(f"protocol must be grpc or http, got {protocol!r}")
        self.module = module
        self.client = module.InferenceServerClient(url)

    def infer(
        self,
        model: str,
        inputs: list,
        *,
        output_names,
        adapter: str | None = None,
        timeout_s: float = 600,
    ):
        parameters = {"lora_name": adapter} if adapter else None
        if self.protocol == "http":
            result = self.client.infer(model, inputs, parameters=parameters)
            yield Reply(_decode(result, output_names), final=True)
            return
        replies: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: replies.put((result, error)))
        try:
            self.client.async_stream_infer(
                model, inputs, parameters=parameters, enable_empty_final_response=True
            )
            while True:
                result, error = replies.get(timeout=timeout_s)
                if error is not None:
                    raise RuntimeError(str(error))
                response = result.get_response()
                final = response.parameters["triton_final_response"].bool_param
                outputs = _decode(result, output_names)
                if outputs or final:
                    yield Reply(outputs, final=final)
                if final:
                    return
        finally:
            self.client.stop_stream()
