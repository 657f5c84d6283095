"""Live transcription latency on /v1/realtime: end of speech -> completed turn, speech -> first
delta, at 1, 4 and 8 concurrent sessions.

  /work/bin/engine-slot .venv/bin/python -m lora_tools.bench.realtime_latency [--sessions 1 4 8]

Starts tritonserver (whisper_lora only) and lora-openai. Each session is OpenAI's transcription
session with server VAD (silence_duration_ms 500) on whisper_lora/alpha, streaming a recording of
three espeak-ng sentences separated by 1.2 s pauses at real-time pace in 40 ms chunks; sessions
of one level start up to 1 s apart. Where each sentence's speech starts and ends in the
recording is known (the sentences' own files), so "end of speech" is when the chunk holding a
sentence's last sample was sent, and "speech" when its first was. Prints p50 / p90 per level
and whether any delta was retracted (a turn's deltas must be a prefix of its completed text);
`--json FILE` also writes the numbers.
"""

import argparse
import asyncio
import base64
import json
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile
import soxr

from lora_serving.launcher import REPO_ROOT, OpenAIFront, TritonServer

RATE = 24000  # lora_client.live's: OpenAI's audio/pcm
CHUNK_MS = 40
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things.",
    "A rainbow is a division of white light into many beautiful colors.",
)
LEAD_S, PAUSE_S, TAIL_S = 0.5, 1.2, 1.5
MODEL = "whisper_lora/alpha"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def recording(work: Path) -> tuple[bytes, list[tuple[float, float]]]:
    """PCM16 24 kHz of the sentences with pauses, and each sentence's (start, end) in seconds."""
    parts, spans, at = [np.zeros(int(LEAD_S * RATE), np.float32)], [], LEAD_S
    for index, sentence in enumerate(SENTENCES):
        path = work / f"s{index}.wav"
        subprocess.run(["espeak-ng", "-w", str(path), sentence], check=True)
        samples, rate = soundfile.read(str(path), dtype="float32")
        samples = soxr.resample(samples, rate, RATE)
        voiced = np.flatnonzero(np.abs(samples) > 1e-3)
        spans.append((at + voiced[0] / RATE, at + voiced[-1] / RATE))
        parts += [samples, np.zeros(int(PAUSE_S * RATE), np.float32)]
        at += len(samples) / RATE + PAUSE_S
    parts.append(np.zeros(int((TAIL_S - PAUSE_S) * RATE), np.float32))
    audio = np.concatenate(parts)
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes(), spans


async def session(url: str, pcm: bytes, spans, delay_s: float) -> dict:
    import websockets

    await asyncio.sleep(delay_s)
    from lora_client.live import session_update

    update = session_update(MODEL, "en", silence_ms=500)
    deltas: dict[str, list[tuple[float, str]]] = {}
    completed: list[tuple[str, float, str]] = []
    async with websockets.connect(f"{url}?intent=transcription", max_size=None) as ws:
        await ws.send(json.dumps(update))
        start = time.monotonic()

        async def sender():
            chunk = RATE * CHUNK_MS // 1000 * 2
            for index, offset in enumerate(range(0, len(pcm), chunk)):
                audio = base64.b64encode(pcm[offset : offset + chunk]).decode()
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
                due = start + (index + 1) * CHUNK_MS / 1000
                await asyncio.sleep(max(0.0, due - time.monotonic()))

        task = asyncio.create_task(sender())
        async with asyncio.timeout(300):
            async for message in ws:
                event = json.loads(message)
                now = time.monotonic() - start
                kind = event["type"]
                if kind == "error":
                    raise RuntimeError(event["error"])
                if kind.endswith("input_audio_transcription.delta"):
                    deltas.setdefault(event["item_id"], []).append((now, event["delta"]))
                elif kind.endswith("input_audio_transcription.completed"):
                    completed.append((event["item_id"], now, event["transcript"]))
                    if len(completed) == len(spans):
                        break
        await task
    result = {"end_to_completed": [], "speech_to_first_delta": [], "retracted": 0}
    for (item, done_at, text), (speech_start, speech_end) in zip(completed, spans, strict=True):
        # the chunk holding the sentence's last sample was sent when the next chunk was due
        end_sent = (int(speech_end * 1000 / CHUNK_MS) + 1) * CHUNK_MS / 1000
        result["end_to_completed"].append(done_at - end_sent)
        first = deltas.get(item, [])
        partial = [at for at, _ in first if at < done_at]
        if partial:
            start_sent = (int(speech_start * 1000 / CHUNK_MS) + 1) * CHUNK_MS / 1000
            result["speech_to_first_delta"].append(partial[0] - start_sent)
        if "".join(delta for _, delta in first) != text:
            result["retracted"] += 1
    return result


def _percentiles(values: list[float]) -> str:
    if not values:
        return f"{'-':>8} {'-':>8}"
    p50, p90 = np.percentile(values, [50, 90])
    return f"{p50 * 1000:>8.0f} {p90 * 1000:>8.0f}"


async def level(url: str, pcm: bytes, spans, sessions: int) -> dict:
    delays = [0.0] + [random.uniform(0, 1) for _ in range(sessions - 1)]
    results = await asyncio.gather(*(session(url, pcm, spans, d) for d in delays))
    merged = {key: [v for r in results for v in r[key]] for key in results[0] if key != "retracted"}
    merged["retracted"] = sum(r["retracted"] for r in results)
    merged["turns"] = len(merged["end_to_completed"])
    return merged


def main(argv=None) -> int:
    sys.stdout.reconfigure(line_buffering=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    random.seed(0)
    work = Path(tempfile.mkdtemp(prefix="realtime-latency-"))
    pcm, spans = recording(work)
    grpc, metrics = _free_port(), _free_port()
    server = TritonServer(
        REPO_ROOT / "model_repository",
        http=_free_port(),
        grpc=grpc,
        metrics=metrics,
        extra_args=["--model-control-mode=explicit", "--load-model=whisper_lora"],
        log_path=work / "tritonserver.log",
    )
    front = None
    try:
        print(f"tritonserver ready in {server.wait_ready(timeout_s=600):.0f} s")
        front = OpenAIFront(grpc, _free_port(), triton_metrics=metrics, log_path=work / "front.log")
        front.wait_listening()
        url = front.url.replace("http://", "ws://") + "/v1/realtime"
        asyncio.run(level(url, pcm, spans, 1))  # warm-up: the engine's first requests are slow
        print(f"{len(SENTENCES)} turns per session, {len(pcm) / 2 / RATE:.1f} s of audio, {MODEL}")
        print("ms: end of speech -> completed (p50 p90), speech -> first delta (p50 p90)")
        print(f"{'sessions':>8} {'turns':>6} {'p50':>8} {'p90':>8} {'p50':>8} {'p90':>8} retracted")
        report = {}
        for count in args.sessions:
            found = asyncio.run(level(url, pcm, spans, count))
            report[count] = found
            completed = _percentiles(found["end_to_completed"])
            first = _percentiles(found["speech_to_first_delta"])
            print(f"{count:>8} {found['turns']:>6} {completed} {first} {found['retracted']:>9}")
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))
        return 0
    finally:
        if front is not None:
            front.stop()
        server.stop()
        print(f"logs: {work}")


if __name__ == "__main__":
    raise SystemExit(main())
