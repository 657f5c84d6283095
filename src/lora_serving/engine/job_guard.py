"""Ends a running job when its client cancels it or its time runs out.

The engine yields nothing for a non-streamed request until it finishes, so checking
`is_cancelled` between outputs would notice a cancel only when the work is done. The guard polls
instead and cancels the job's task; vLLM's generate() aborts the engine request when its task is
cancelled, so no more tokens are generated for it. The task's CancelledError becomes
RequestCancelled or RequestTimedOut (the same trick as asyncio.timeout: `uncancel()` tells our
cancel from anyone else's).
"""

import asyncio
import contextlib
import time

from lora_serving.errors import RequestCancelled, RequestTimedOut

POLL_S = 0.25


class JobGuard:
    def __init__(self, timeout_s: float, is_cancelled=lambda: False, poll_s: float = POLL_S):
        self.timeout_s = timeout_s
        self._is_cancelled = is_cancelled
        self._poll_s = poll_s
        self._reason: Exception | None = None
        self._task: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None

    async def __aenter__(self) -> "JobGuard":
        self._task = asyncio.current_task()
        self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return self

    async def __aexit__(self, kind, error, trace) -> bool:
        self._watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watcher
        if self._reason is not None and kind is asyncio.CancelledError:
            self._task.uncancel()
            raise self._reason from None
        return False

    async def _watch(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            await asyncio.sleep(min(self._poll_s, max(deadline - time.monotonic(), 0)))
            if self._cancelled():
                self._reason = RequestCancelled("request cancelled by the client")
            elif time.monotonic() >= deadline:
                self._reason = RequestTimedOut(
                    f"request exceeded its {self.timeout_s:g} s timeout and was stopped"
                )
            else:
                continue
            self._task.cancel()
            return

    def _cancelled(self) -> bool:
        try:
            return bool(self._is_cancelled())
        except Exception:  # the request is gone on Triton's side: nobody is waiting for it
            return True
