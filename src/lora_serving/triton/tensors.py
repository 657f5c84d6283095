"""Triton InferenceRequest <-> our plain types (RawRequest in, output values out)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from lora_serving.errors import InvalidRequest
from lora_serving.request_inputs import RawRequest


def read_request(request, input_names: tuple[str, ...]) -> RawRequest:
    tensors = {}
    for name in input_names:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is not None:
            tensors[name] = tensor.as_numpy()
    try:
        parameters = json.loads(request.parameters() or "{}")
    except json.JSONDecodeError:
        raise InvalidRequest("request parameters are not valid JSON") from None
    return RawRequest(tensors=tensors, parameters=parameters, request_id=request.request_id())


def to_response(
    rows: list[dict], output_dtypes: dict[str, np.dtype]
) -> "pb_utils.InferenceResponse":
    """One response holding every batch row: each output gets shape [rows, 1]. An output the
    rows do not carry (an additional output nobody asked for) is left out."""
    tensors = []
    for name, dtype in output_dtypes.items():
        if name not in rows[0]:
            continue
        values = [row[name] for row in rows]
        if dtype == np.object_:
            array = np.array([[str(v).encode("utf-8")] for v in values], dtype=np.object_)
        else:
            array = np.array([[v] for v in values], dtype=dtype)
        tensors.append(pb_utils.Tensor(name, array))
    return pb_utils.InferenceResponse(output_tensors=tensors)
