"""Engine utility calls (adapter loads, listings, counts), each bounded in time."""

import asyncio
from collections.abc import Coroutine

from lora_serving.errors import EngineUnavailable

# Bounds on engine utility calls: loading one adapter from a local disk takes far less.
LOAD_TIMEOUT_S = 120.0
QUERY_TIMEOUT_S = 15.0


async def ask_engine(what: str, call: Coroutine, timeout_s: float):
    """An engine utility call, bounded: one sent as the engine dies is never answered."""
    try:
        return await asyncio.wait_for(call, timeout_s)
    except TimeoutError:
        raise EngineUnavailable(
            f"the engine did not answer {what} within {timeout_s:g} s"
        ) from None
