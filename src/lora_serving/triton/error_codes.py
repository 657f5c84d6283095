"""Our errors -> Triton error responses, so clients can tell their fault from ours."""

import triton_python_backend_utils as pb_utils

from lora_serving.errors import (
    AdapterUnavailable,
    EngineUnavailable,
    InvalidRequest,
    RequestCancelled,
    UnknownAdapter,
)

_CODES = (
    (UnknownAdapter, "NOT_FOUND"),
    (InvalidRequest, "INVALID_ARG"),
    (EngineUnavailable, "UNAVAILABLE"),
    (AdapterUnavailable, "UNAVAILABLE"),
    (RequestCancelled, "CANCELLED"),
)


def error_response(err: BaseException) -> "pb_utils.InferenceResponse":
    code_name = next((code for kind, code in _CODES if isinstance(err, kind)), "INTERNAL")
    message = str(err) if code_name != "INTERNAL" else f"internal error: {err!r}"
    error = pb_utils.TritonError(message, getattr(pb_utils.TritonError, code_name))
    return pb_utils.InferenceResponse(error=error)
