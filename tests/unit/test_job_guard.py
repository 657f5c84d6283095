"""JobGuard: a cancel or a timeout ends the guarded work with our error, nothing else does."""

import asyncio

import pytest

from lora_serving.engine.job_guard import JobGuard
from lora_serving.errors import RequestCancelled, RequestTimedOut


async def guarded(seconds: float, **guard) -> str:
    async with JobGuard(poll_s=0.01, **guard):
        await asyncio.sleep(seconds)
    return "done"


def test_work_that_finishes_in_time_is_left_alone():
    assert asyncio.run(guarded(0.05, timeout_s=5)) == "done"


def test_timeout_stops_the_work():
    with pytest.raises(RequestTimedOut, match="exceeded its 0.05 s timeout"):
        asyncio.run(asyncio.wait_for(guarded(10, timeout_s=0.05), 2))


def test_client_cancel_stops_the_work():
    calls = []

    def is_cancelled():
        calls.append(1)
        return len(calls) >= 3

    with pytest.raises(RequestCancelled, match="cancelled by the client"):
        asyncio.run(asyncio.wait_for(guarded(10, timeout_s=60, is_cancelled=is_cancelled), 2))


def test_a_failing_cancel_check_counts_as_cancelled():
    def is_cancelled():
        raise RuntimeError("request released")

    with pytest.raises(RequestCancelled):
        asyncio.run(asyncio.wait_for(guarded(10, timeout_s=60, is_cancelled=is_cancelled), 2))


def test_someone_elses_cancel_stays_a_cancel():
    async def main():
        task = asyncio.ensure_future(guarded(10, timeout_s=60))
        await asyncio.sleep(0.05)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


def test_errors_of_the_work_pass_through():
    async def failing():
        async with JobGuard(timeout_s=60, poll_s=0.01):
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(failing())
