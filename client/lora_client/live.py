"""`lora-client live FILE`: a speech file streamed to lora-openai's /v1/realtime at real-time
pace (OpenAI's transcription session, server VAD), printing the partial text as it is sent
(deltas, never retracted) and each turn once it is complete."""

import asyncio
import base64
import json
import sys
import time
from pathlib import Path

import numpy as np

RATE = 24000  # OpenAI's audio/pcm
CHUNK_MS = 40


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


async def stream(
    url: str,
    model: str,
    path: Path,
    *,
    api_key: str | None = None,
    language: str | None = None,
    silence_ms: int = 500,
    speed: float = 1.0,
    out=sys.stdout,
) -> list[str]:
    """Stream `path`; print deltas and turns; return the completed turns' text."""
    import websockets

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    pcm = pcm16(path)
    turns: list[str] = []
    committed: set[str] = set()
    async with websockets.connect(f"{url}?intent=transcription", additional_headers=headers) as ws:
        await ws.send(json.dumps(session_update(model, language, silence_ms)))
        sent_all = asyncio.Event()

        async def sender():
            chunk = RATE * CHUNK_MS // 1000 * 2
            start = time.monotonic()
            for index, offset in enumerate(range(0, len(pcm), chunk)):
                audio = base64.b64encode(pcm[offset : offset + chunk]).decode()
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
                due = start + (index + 1) * CHUNK_MS / 1000 / speed
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            # One second of silence ends a last turn; then the end of what was sent is marked.
            silence = base64.b64encode(bytes(RATE * 2)).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": silence}))
            await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
            sent_all.set()

        task = asyncio.create_task(sender())
        cleared = False
        try:
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
