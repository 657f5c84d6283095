"""OpenAI's error shape and the HTTP status of each failure.

OpenAI answers `{"error": {"message", "type", "param", "code"}}`. Errors from Triton arrive as
plain messages on the gRPC stream (the stream carries no status code), so they are classified
by the wording our models use (lora_serving.errors, Triton's own messages).
"""

import re
from dataclasses import dataclass

# HTTP status -> OpenAI's error `type` (as the OpenAI API and vLLM's server name them).
_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",  # as OpenAI: code "invalid_api_key"
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    499: "cancelled",
    500: "internal_server_error",
    503: "service_unavailable",
}

# (substring of a Triton error message, HTTP status, OpenAI code); first match wins.
_TRITON_MESSAGES = (
    ("unknown adapter", 404, "model_not_found"),
    ("byte limit", 413, "request_too_large"),  # qwen_vl_lora: an image over max_payload_bytes
    ("bytes; at most", 413, "request_too_large"),  # whisper_lora: audio over max_payload_bytes
    ("request for unknown model", 404, "model_not_found"),
    ("is not ready", 503, "model_not_ready"),
    ("cannot be served", 503, "adapter_unavailable"),
    ("exceeded its", 503, "timeout"),
    ("unavailable", 503, "service_unavailable"),
    ("cancelled", 499, "cancelled"),
    ("internal error", 500, "internal_error"),
)


@dataclass
class OpenAIError(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        return self.message

    def headers(self) -> dict[str, str]:
        return {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="invalid_value" if param else None)


def unknown_model(model: str, available: list[str]) -> OpenAIError:
    listed = ", ".join(available) or "none"
    return OpenAIError(
        404,
        f"The model '{model}' does not exist; available: {listed}",
        param="model",
        code="model_not_found",
    )


# Triton's "unknown adapter 'x'; available: a, b, ..." names every adapter of the model: the
# list is cut, whoever asks (the front answers unknown models itself, naming the caller's ids).
_AVAILABLE = re.compile(r";\s*available:.*$", re.DOTALL)


def from_triton(message: str) -> OpenAIError:
    """A Triton error message -> OpenAIError; anything not recognised is the client's (400),
    as our models report every bad input as INVALID_ARG with a message naming it."""
    message = _AVAILABLE.sub("", message)
    lowered = message.lower()
    for fragment, status, code in _TRITON_MESSAGES:
        if fragment in lowered:
            return OpenAIError(status, message, code=code)
    return OpenAIError(400, message)
