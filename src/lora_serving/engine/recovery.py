"""What a model does once its vLLM engine has died: neither Triton nor vLLM restarts an engine.

1. It unloads itself (`--model-control-mode=explicit`): Triton reports it not ready and refuses
   its requests at once; the repository API loads it again with a new engine.
2. If it cannot unload (model control `none`, the container default), a server that can never
   serve that model again must not look alive: its liveness endpoint stays 200 while readiness
   is false, so Kubernetes would keep the pod NotReady, holding its GPU, forever, and compose
   ignores health altogether. So the server is stopped (SIGTERM to tritonserver: Triton drains
   its in-flight requests and exits) and its supervisor (Kubernetes, compose's
   `restart: unless-stopped`, systemd) starts a fresh one. `serving.exit_on_engine_death: false`
   keeps it running instead, answering that model's requests with UNAVAILABLE.
"""

import enum
from collections.abc import Callable


class Recovery(enum.Enum):
    UNLOADED = "unloaded"  # Triton reports the model not ready; reload it to recover
    STOP_SERVER = "stop_server"  # the supervisor restarts the server
    KEEP_FAILING = "keep_failing"  # requests fail with UNAVAILABLE until a restart


def after_engine_death(
    unload: Callable[[], None], *, exit_on_engine_death: bool
) -> tuple[Recovery, str | None]:
    """Try `unload()`; say what to do next and why unloading failed (None if it did not)."""
    try:
        unload()
    except Exception as err:  # e.g. model control "none": Triton refuses
        return (
            Recovery.STOP_SERVER if exit_on_engine_death else Recovery.KEEP_FAILING,
            str(err),
        )
    return Recovery.UNLOADED, None
