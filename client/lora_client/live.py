"""`lora-client live FILE|-`: speech streamed to lora-openai's /v1/realtime (OpenAI's
transcription session, server VAD), printing the partial text as it is sent (deltas, never
retracted) and each turn once it is complete.

A file is sent at real-time pace. `-` reads raw PCM16 mono 24 kHz from standard input as it
arrives, so a microphone is a pipe away (`arecord -q -t raw -f S16_LE -r 24000 -c 1 |
lora-client live -`); the source paces itself. Ctrl-C (or the end of the input) stops sending,
and the turns still being transcribed are awaited; a second Ctrl-C leaves at once."""

import asyncio
import base64
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

RATE = 24000  # OpenAI's audio/pcm
CHUNK_MS = 40
CHUNK_BYTES = RATE * CHUNK_MS // 1000 * 2


def pcm16(path: Path) -> bytes:
    """Any file soundfile reads -> mono PCM16 at 24 kHz."""
    import soundfile
    import soxr

    samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    mono = samples.mean(axis=1)
    if rate != RATE:
        mono = soxr.resample(mono, rate, RATE)
    return (np.clip(mono, -1, 1) * 32767).astype("<i2").tobytes()


def session_update(model: str, language: str | None, silence_ms: int) -> dict:
    return {
        "type": "session.update",
        "session": {
            "type": "transcription",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": RATE},
                    "transcription": {"model": model, "language": language},
                    "turn_detection": {"type": "server_vad", "silence_duration_ms": silence_ms},
                }
            },
        },
    }


async def file_chunks(path: Path, speed: float = 1.0) -> AsyncIterator[bytes]:
    """`path` as PCM16 24 kHz chunks of CHUNK_MS, each sent when real time (times `speed`)
    reaches it."""
    pcm = pcm16(path)
    start = time.monotonic()
    for index, offset in enumerate(range(0, len(pcm), CHUNK_BYTES)):
        yield pcm[offset : offset + CHUNK_BYTES]
        due = start + (index + 1) * CHUNK_MS / 1000 / speed
        await asyncio.sleep(max(0.0, due - time.monotonic()))


async def pipe_chunks(source: BinaryIO) -> AsyncIterator[bytes]:
    """Raw PCM16 from `source` (standard input) in chunks of CHUNK_MS as they arrive; a trailing
    odd byte is dropped. A daemon thread reads the file descriptor itself, so a read still blocked
    at exit neither holds the exit up nor holds a buffered reader's lock (Python aborts on that)."""
    loop = asyncio.get_running_loop()
    reads: asyncio.Queue[bytes] = asyncio.Queue()
    descriptor = source.fileno()

    def read() -> None:
        while True:
            data = os.read(descriptor, CHUNK_BYTES)
            try:
                loop.call_soon_threadsafe(reads.put_nowait, data)
            except RuntimeError:  # the loop is closed: the client is done
                return
            if not data:
                return  # the end of the input

    threading.Thread(target=read, daemon=True).start()
    pending = b""
    while True:
        data = await reads.get()
        pending += data
        while len(pending) >= CHUNK_BYTES or (not data and len(pending) >= 2):
            size = min(CHUNK_BYTES, len(pending) // 2 * 2)
            yield pending[:size]
            pending = pending[size:]
        if not data:
            return


async def until(stop: asyncio.Event, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`chunks` until `stop` is set, even while the source has nothing to give: a microphone's
    pipe stays open and quiet after Ctrl-C, so waiting for its next chunk would never end."""
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while True:
            following = asyncio.ensure_future(anext(chunks))
            await asyncio.wait({following, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if stopped.done():
                following.cancel()
                return
            try:
                chunk = following.result()
            except StopAsyncIteration:
                return
            yield chunk
    finally:
        stopped.cancel()


@contextlib.contextmanager
def first_interrupt_sets(stop: asyncio.Event):
    """The first Ctrl-C sets `stop` (finish what was said); the second is Python's own."""
    loop = asyncio.get_running_loop()

    def interrupted() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    try:
        loop.add_signal_handler(signal.SIGINT, interrupted)
    except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def stream(
    url: str,
    model: str,
    chunks: AsyncIterator[bytes],
    *,
    api_key: str | None = None,
    language: str | None = None,
    silence_ms: int = 500,
    out=sys.stdout,
) -> list[str]:
    """Send `chunks` (PCM16 24 kHz); print deltas and turns; return the completed turns' text."""
    import websockets

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    turns: list[str] = []
    committed: set[str] = set()
    stop = asyncio.Event()
    async with websockets.connect(f"{url}?intent=transcription", additional_headers=headers) as ws:
        await ws.send(json.dumps(session_update(model, language, silence_ms)))

        async def send(pcm: bytes) -> None:
            audio = base64.b64encode(pcm).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))

        async def sender():
            async for chunk in until(stop, chunks):
                await send(chunk)
            # One second of silence ends a last turn; then the end of what was sent is marked.
            await send(bytes(RATE * 2))
            await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))

        task = asyncio.create_task(sender())
        cleared = False
        try:
            with first_interrupt_sets(stop):
                async for message in ws:
                    event = json.loads(message)
                    kind = event["type"]
                    if kind == "error":
                        error = event["error"]
                        raise RuntimeError(f"{error.get('code')}: {error.get('message')}")
                    if kind == "input_audio_buffer.committed":
                        committed.add(event["item_id"])
                    elif kind == "conversation.item.input_audio_transcription.delta":
                        out.write(event["delta"])
                        out.flush()
                    elif kind == "conversation.item.input_audio_transcription.completed":
                        turns.append(event["transcript"])
                        out.write(f"\n[turn {len(turns)}] {event['transcript'].strip()}\n")
                        out.flush()
                    elif kind == "input_audio_buffer.cleared":
                        cleared = True
                    if cleared and len(turns) >= len(committed):
                        break
        finally:
            task.cancel()
    return turns
