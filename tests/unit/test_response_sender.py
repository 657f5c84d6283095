"""RequestChannel / Outbox: no call into a request's Triton sender after its FINAL response
(issue 19: python_backend's is_cancelled() after the FINAL one reads a freed response factory
in tritonserver). The fake sender plays Triton: it frees the factory when the FINAL response is
sent and records any call that reaches it afterwards."""

import threading
import time

import pytest

from lora_serving.triton.response_sender import Outbox

FINAL = 1


class FakeTritonSender:
    def __init__(self, ask_s: float = 0.0):
        self.ask_s = ask_s  # how long one is_cancelled round trip takes
        self.freed = False
        self.asking = False
        self.cancelled = False
        self.sent: list[tuple[object, int]] = []
        self.violations: list[str] = []

    def is_cancelled(self) -> bool:
        if self.freed:
            self.violations.append("is_cancelled after FINAL")
        self.asking = True
        time.sleep(self.ask_s)
        self.asking = False
        return self.cancelled

    def send(self, response=None, flags=0):
        if self.freed:
            self.violations.append("send after FINAL")
        if self.asking and flags == FINAL:
            self.violations.append("FINAL sent while is_cancelled was in flight")
        self.sent.append((response, flags))
        if flags == FINAL:
            self.freed = True


class FakeRequest:
    def __init__(self, sender):
        self.sender = sender

    def get_response_sender(self):
        return self.sender


@pytest.fixture
def outbox():
    logged: list[str] = []
    box = Outbox(logged.append, final_flag=FINAL)
    box.logged = logged
    yield box
    box.close()


def test_final_closes_the_channel_for_good(outbox):
    sender = FakeTritonSender()
    channel = outbox.channel(FakeRequest(sender))
    assert channel.send("partial", final=False)
    assert not channel.is_cancelled()
    assert channel.send("last", final=True)
    assert channel.closed
    assert not channel.is_cancelled()  # answered from what Triton said last
    assert not channel.send("late", final=True)
    outbox.close()
    assert sender.sent == [("partial", 0), ("last", FINAL)]
    assert sender.violations == []
    assert any("after the request's FINAL" in line for line in outbox.logged)


def test_a_cancel_seen_before_final_stays_seen(outbox):
    sender = FakeTritonSender()
    channel = outbox.channel(FakeRequest(sender))
    sender.cancelled = True
    assert channel.is_cancelled()
    channel.send(None, final=True)
    assert channel.is_cancelled()


def test_polls_racing_the_final_response_never_reach_a_freed_sender(outbox):
    """The crash's shape: a poll every ~0 s on one thread, FINAL sent from the outbox thread
    while a slow is_cancelled round trip may be in flight."""
    senders = [FakeTritonSender(ask_s=0.0005) for _ in range(200)]
    channels = [outbox.channel(FakeRequest(sender)) for sender in senders]
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            for channel in channels:
                channel.is_cancelled()

    pollers = [threading.Thread(target=poll) for _ in range(2)]
    for thread in pollers:
        thread.start()
    for channel in channels:
        channel.send("row", final=True)
        time.sleep(0.001)
    outbox.close()
    stop.set()
    for thread in pollers:
        thread.join()
    assert [v for sender in senders for v in sender.violations] == []
    assert all(sender.sent == [("row", FINAL)] for sender in senders)


def test_close_answers_every_request_left_open(outbox):
    done, open_ = FakeTritonSender(), FakeTritonSender()
    outbox.channel(FakeRequest(done)).send("ok", final=True)
    outbox.channel(FakeRequest(open_)).send("partial", final=False)
    assert outbox.open_channels == 1
    outbox.close(lambda: "model unloading")
    assert done.sent == [("ok", FINAL)]
    assert open_.sent == [("partial", 0), ("model unloading", FINAL)]
    assert outbox.open_channels == 0
