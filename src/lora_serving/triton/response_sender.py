"""The only way back to a client: every response, and every question whether it cancelled.

One rule is enforced here, for every path (streamed, not streamed, errors, commands, shutdown):
once a request's FINAL response has been handed over, nothing calls into that request's Triton
response sender again. Triton frees the request's response factory right after sending the
FINAL response, and python_backend's `is_cancelled()` (24.10 and still upstream) hands the
factory's address to the server process, which then reads freed memory: tritonserver died with
SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled when a job's cancel poll on the engine loop
met its FINAL response going out on the sender thread (issue 19).

A RequestChannel serialises the two: `is_cancelled()` asks Triton under the channel's lock and
only while the channel is open; `send(final=True)` closes the channel under the same lock before
the response is queued. So when a FINAL response is queued, no question is in flight and none
will start. Responses go out on one thread (the Outbox), so the engine loop never blocks on
Triton.
"""

import queue
import threading
from collections.abc import Callable

_STOP = object()


class RequestChannel:
    """One Triton request's response sender, closed for good by its FINAL response."""

    def __init__(self, sender, outbox: "Outbox"):
        self._sender = sender
        self._outbox = outbox
        self._lock = threading.Lock()
        self._closed = False
        self._cancelled = False

    @property
    def closed(self) -> bool:
        return self._closed

    def is_cancelled(self) -> bool:
        """Whether the client cancelled; after the FINAL response, the last answer Triton gave
        (Triton is not asked again). Triton's own errors propagate."""
        with self._lock:
            if not self._closed and not self._cancelled:
                self._cancelled = bool(self._sender.is_cancelled())
            return self._cancelled

    def send(self, response, *, final: bool) -> bool:
        """Queue a response (None with final: just the FINAL flag). Returns False, and sends
        nothing, once the FINAL response has been handed over."""
        with self._lock:
            if self._closed:
                sender = None
            else:
                sender, self._closed = self._sender, final
                if final:
                    self._sender = None  # the factory behind it is Triton's to free now
        if sender is None:
            self._outbox.refuse_after_final()
            return False
        self._outbox.put(self, sender, response, final)
        return True


class Outbox:
    """One queue and one thread send every response; `close()` answers requests left open."""

    def __init__(self, log: Callable[[str], None], *, final_flag: int):
        self._log = log
        self._final_flag = final_flag
        self._open: set[RequestChannel] = set()
        self._open_lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="response-sender", daemon=True)
        self._thread.start()

    def channel(self, request) -> RequestChannel:
        channel = RequestChannel(request.get_response_sender(), self)
        with self._open_lock:
            self._open.add(channel)
        return channel

    @property
    def open_channels(self) -> int:
        with self._open_lock:
            return len(self._open)

    def put(self, channel: RequestChannel, sender, response, final: bool) -> None:
        if final:
            with self._open_lock:
                self._open.discard(channel)
        self._queue.put((sender, response, final))

    def refuse_after_final(self) -> None:
        self._log("a response after the request's FINAL one was dropped (a bug: please report)")

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            sender, response, final = item
            flags = self._final_flag if final else 0
            try:
                if response is None:
                    sender.send(flags=flags)
                else:
                    sender.send(response, flags=flags)
            except Exception as err:  # client gone: nothing to deliver to, keep serving others
                self._log(f"could not send a response: {err!r}")

    def close(self, last_response: Callable[[], object] | None = None) -> None:
        """Answer every request still open with `last_response()` (FINAL), send what is
        queued, stop the thread."""
        with self._open_lock:
            left = list(self._open)
        for channel in left:
            channel.send(last_response() if last_response else None, final=True)
        self._queue.put(_STOP)
        self._thread.join(timeout=10)
