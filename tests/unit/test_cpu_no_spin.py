"""cpu_no_spin: vLLM's shared-memory message queue readers sleep instead of spinning, and
still take every message promptly. Runs vLLM's own MessageQueue (writer and reader threads in
this process)."""

import threading
import time

import pytest
from vllm.distributed.device_communicators import shm_broadcast

from lora_serving.vllm_plugin import cpu_no_spin


@pytest.fixture
def no_spin(monkeypatch):
    condition = shm_broadcast.SpinCondition
    before, saved = condition.__dict__["wait"], dict(cpu_no_spin._ORIGINAL)
    # vLLM's own wait, also when an earlier test's register() applied the plugin already.
    condition.wait = saved["wait"] if before is cpu_no_spin._wait else before
    monkeypatch.delenv(cpu_no_spin.SPIN_ENV, raising=False)
    cpu_no_spin._ORIGINAL.clear()
    assert cpu_no_spin.apply()
    assert not cpu_no_spin.apply()  # applied once
    yield
    condition.wait = before
    cpu_no_spin._ORIGINAL.clear()
    cpu_no_spin._ORIGINAL.update(saved)


def connected_queue():
    writer = shm_broadcast.MessageQueue(n_reader=1, n_local_reader=1)
    reader_box = {}

    def connect_reader():
        reader_box["queue"] = shm_broadcast.MessageQueue.create_from_handle(
            writer.export_handle(), 0
        )
        reader_box["queue"].wait_until_ready()

    thread = threading.Thread(target=connect_reader)
    thread.start()
    writer.wait_until_ready()
    thread.join(timeout=30)
    return writer, reader_box["queue"]


def read_in_thread(reader, count: int):
    """Read `count` messages in a thread; (messages with their arrival times, reader CPU s)."""
    got = []
    cpu = {}

    def run():
        start = time.thread_time()
        for _ in range(count):
            message = reader.dequeue(timeout=30)
            got.append((message, time.monotonic()))
        cpu["s"] = time.thread_time() - start

    thread = threading.Thread(target=run)
    thread.start()
    return thread, got, cpu


def test_reader_waiting_for_a_late_message_sleeps(no_spin):
    writer, reader = connected_queue()
    writer.enqueue("first")
    assert reader.dequeue(timeout=10) == "first"  # a read just now: vLLM would spin for 1 s
    thread, got, cpu = read_in_thread(reader, 1)
    time.sleep(0.6)
    sent = time.monotonic()
    writer.enqueue("late")
    thread.join(timeout=10)
    assert [m for m, _ in got] == ["late"]
    assert got[0][1] - sent < 0.1, "woken late"
    # vLLM's spin would have burnt ~0.6 s of CPU on sched_yield here.
    assert cpu["s"] < 0.15, f"the waiting reader used {cpu['s']:.2f} s of CPU"


def test_every_message_arrives_promptly_at_any_pace(no_spin):
    """Bursts and gaps, the reader asleep between them: every message, in order, none held
    back (a notification the writer's socket drops is covered by the capped sleep below; it
    needs two processes' timing to happen)."""
    writer, reader = connected_queue()
    count = 300
    thread, got, _ = read_in_thread(reader, count)
    sent_at = []
    for n in range(count):
        sent_at.append(time.monotonic())
        writer.enqueue(n)
        if n % 3 == 0:
            time.sleep(0.002 * (n % 7))
    thread.join(timeout=60)
    assert [m for m, _ in got] == list(range(count))
    worst = max(arrived - sent for (_, arrived), sent in zip(got, sent_at, strict=True))
    assert worst < 0.5, f"a message waited {worst:.2f} s"


def test_sleep_is_capped_only_while_messages_flow():
    recent, idle = 0.01, cpu_no_spin.RECENT_READ_S + 1
    assert cpu_no_spin.capped_timeout_ms(None, recent) == cpu_no_spin.RECHECK_MS
    assert cpu_no_spin.capped_timeout_ms(5000, recent) == cpu_no_spin.RECHECK_MS
    assert cpu_no_spin.capped_timeout_ms(0, recent) == 0
    assert cpu_no_spin.capped_timeout_ms(5000, idle) == 5000
    assert cpu_no_spin.capped_timeout_ms(None, idle) is None


def test_spin_time_is_the_operators_to_choose(monkeypatch):
    monkeypatch.setenv(cpu_no_spin.SPIN_ENV, "1.0")
    assert cpu_no_spin.spin_seconds() == 1.0
    monkeypatch.delenv(cpu_no_spin.SPIN_ENV)
    assert cpu_no_spin.spin_seconds() == 0.0
