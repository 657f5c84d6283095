"""One queue and one thread send every response, so the engine loop never blocks on Triton."""

import queue
import threading

import triton_python_backend_utils as pb_utils

_STOP = object()


class ResponseSender:
    def __init__(self, log):
        self._queue: queue.Queue = queue.Queue()
        self._log = log
        self._thread = threading.Thread(target=self._run, name="response-sender", daemon=True)
        self._thread.start()

    def send(self, sender, response, *, final: bool) -> None:
        self._queue.put((sender, response, final))

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            sender, response, final = item
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
            try:
                if response is None:
                    sender.send(flags=flags)
                else:
                    sender.send(response, flags=flags)
            except Exception as err:  # client gone: nothing to deliver to, keep serving others
                self._log(f"could not send a response: {err!r}")

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout=10)
