"""lora-client live's sources: a pipe (a microphone's raw PCM on standard input) read in chunks as
it arrives, and a file paced at real time."""

import asyncio
import os
import time
import wave

import numpy as np
from lora_client import live


def collect(chunks) -> list[bytes]:
    async def run():
        return [chunk async for chunk in chunks]

    return asyncio.run(run())


def test_a_pipe_is_read_in_chunks_as_it_arrives_and_ends_at_its_end():
    read_end, write_end = os.pipe()
    body = bytes(range(256)) * 20 + b"\x01"  # 5121 bytes: a trailing odd byte

    async def run():
        arrived = []
        with os.fdopen(read_end, "rb") as source:

            async def writer():
                with os.fdopen(write_end, "wb", buffering=0) as sink:
                    for offset in range(0, len(body), 1000):
                        sink.write(body[offset : offset + 1000])
                        await asyncio.sleep(0.02)

            task = asyncio.create_task(writer())
            async for chunk in live.pipe_chunks(source):
                arrived.append((time.monotonic(), chunk))
            await task
        return arrived

    arrived = asyncio.run(run())
    chunks = [chunk for _, chunk in arrived]
    assert all(len(chunk) == live.CHUNK_BYTES for chunk in chunks[:-1])
    assert all(len(chunk) % 2 == 0 for chunk in chunks)
    assert b"".join(chunks) == body[:-1]  # whole samples only
    # the first chunk came before the writer had finished: read as it arrives, not at the end
    assert arrived[0][0] < arrived[-1][0] - 0.02


def test_an_empty_pipe_yields_nothing():
    read_end, write_end = os.pipe()
    os.close(write_end)
    with os.fdopen(read_end, "rb") as source:
        assert collect(live.pipe_chunks(source)) == []


def test_a_file_is_paced_at_real_time_times_speed(tmp_path):
    path = tmp_path / "tone.wav"
    samples = (np.sin(np.arange(12000) / 8) * 8000).astype("<i2")  # 0.5 s at 24 kHz
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(live.RATE)
        out.writeframes(samples.tobytes())
    started = time.monotonic()
    chunks = collect(live.file_chunks(path, speed=2.0))
    took = time.monotonic() - started
    sent = np.frombuffer(b"".join(chunks), "<i2")
    assert np.abs(sent.astype(int) - samples).max() <= 1  # float32 and back: rounding only
    assert len(chunks) == 13  # 500 ms in 40 ms chunks
    assert 0.2 <= took < 0.6  # 0.5 s of audio at twice real time


def test_sending_stops_when_asked_though_the_source_is_quiet():
    """After Ctrl-C a microphone's pipe stays open with nothing to read: sending ends anyway."""

    async def quiet_after_one():
        yield b"\x00\x01"
        await asyncio.sleep(3600)
        yield b"never"

    async def run():
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.1, stop.set)
        started = time.monotonic()
        chunks = [chunk async for chunk in live.until(stop, quiet_after_one())]
        return chunks, time.monotonic() - started

    chunks, took = asyncio.run(run())
    assert chunks == [b"\x00\x01"]
    assert took < 1.0


def test_until_passes_a_whole_source_through():
    async def three():
        for chunk in (b"ab", b"cd", b"ef"):
            yield chunk

    async def run():
        return [chunk async for chunk in live.until(asyncio.Event(), three())]

    assert asyncio.run(run()) == [b"ab", b"cd", b"ef"]
