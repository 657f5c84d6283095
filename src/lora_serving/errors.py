"""Errors a request can end with; the Triton layer maps each kind to a Triton error code.

No Triton import here: the core raises these and `lora_serving.triton.error_codes` translates.
"""


class ServingError(Exception):
    """Base class: the message is shown to the client as is."""


class InvalidRequest(ServingError):
    """The request itself is wrong (missing/ill-typed input, bad value). Maps to INVALID_ARG."""


class UnknownAdapter(InvalidRequest):
    """The request names an adapter this model does not serve. Maps to NOT_FOUND."""

    def __init__(self, name: str, available: list[str]):
        listed = ", ".join(sorted(available)) if available else "none"
        super().__init__(f"unknown adapter '{name}'; available: {listed}")
        self.name = name


class EngineUnavailable(ServingError):
    """The engine is dead, shutting down or not started. Maps to UNAVAILABLE."""


class AdapterUnavailable(ServingError):
    """The adapter is known but cannot be served now (its checked files changed on disk).
    Maps to UNAVAILABLE."""


class RequestTimedOut(EngineUnavailable):
    """The request ran longer than its timeout and was stopped. Maps to UNAVAILABLE."""


class RequestCancelled(ServingError):
    """The client cancelled the request. Maps to CANCELLED."""


class ConfigError(ValueError):
    """model.json / multi_lora.json are wrong; raised at load time with every problem listed."""

    def __init__(self, source: str, problems: list[str]):
        super().__init__(f"{source}: " + "; ".join(problems))
        self.problems = problems
