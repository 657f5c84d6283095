"""Live transcription latency on /v1/realtime: end of speech -> completed turn, speech -> first
delta, at 1, 4 and 8 concurrent sessions; live WER next to the file path's, and the per-turn file
upload a user would pick instead of live.

  .venv/bin/python -m lora_tools.bench.realtime_latency \
      [--sessions 1 4 8] [--out DIR]

Starts tritonserver (whisper_lora only) and lora-openai. Each session is OpenAI's transcription
session with server VAD (silence_duration_ms 500) on whisper_lora/alpha, streaming a ~60 s
recording (the wer bench's sentences after the corpus' ordinary ones, espeak-ng, 1.2 s pauses)
at real-time pace in 40 ms chunks; sessions of one level start up to 1 s apart. Where each
sentence's speech starts and ends in the recording is known (the sentences' own files), so "end
of speech" is when the chunk holding a sentence's last sample was sent, and "speech" when its
first was. A sentence counts only where it got a completed turn of its own (VAD start/end).
At 1 session it also measures:
  - each completed turn against the file transcription of that turn's own audio (cut where its
    speech_started / speech_stopped events say), which should be equal word for word;
  - WER of the completed turns joined against the sentences, and of the same recording uploaded
    whole to /v1/audio/transcriptions (the issue's bar: within 1 point);
  - the peer: each sentence's audio (the same spans, padded as server VAD pads a turn: 300 ms
    before, the 500 ms of silence after) uploaded as a file, one at a time, upload -> text
    p50 / p90, beside end of speech -> completed.
Writes results.json, report.md and latency.png to --out (default results/realtime-latency-<time>/).
"""

import argparse
import asyncio
import base64
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import soundfile
import soxr

from lora_openai.realtime.transcribe import wav_file
from lora_serving.launcher import REPO_ROOT
from lora_tools.bench import realtime_report, wer
from lora_tools.bench.processes import whisper_front
from lora_tools.bench.realtime_report import CHUNK_MS
from lora_tools.finetune import corpus

RATE = 24000  # lora_client.live's: OpenAI's audio/pcm
# 15 sentences of ~2.6 s with 1.2 s pauses: about 60 s of audio.
SENTENCES = wer.SENTENCES[len(corpus.ORDINARY_SENTENCES) :][:15]
LEAD_S, PAUSE_S, TAIL_S = 0.5, 1.2, 1.5
SILENCE_MS = 500
# The peer's file of a sentence is cut as server VAD cuts its turn: from prefix_padding_ms
# (its default, 300) before the speech to the silence that ends the turn after it.
PEER_PADDING_S = (0.3, SILENCE_MS / 1000)
MODEL = "whisper_lora/alpha"
COMPLETED = "conversation.item.input_audio_transcription.completed"
DELTA = "conversation.item.input_audio_transcription.delta"


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


# ---- live --------------------------------------------------------------------------------------
async def session(url: str, pcm: bytes, delay_s: float) -> list[dict]:
    """One transcription session streaming `pcm`: its turns (see realtime_report.session_numbers),
    once the audio is sent and every turn that started has completed."""
    import websockets

    await asyncio.sleep(delay_s)
    from lora_client.live import session_update

    update = session_update(MODEL, "en", silence_ms=SILENCE_MS)
    turns: dict[str, dict] = {}
    async with websockets.connect(f"{url}?intent=transcription", max_size=None) as ws:
        await ws.send(json.dumps(update))
        start = time.monotonic()

        recording_sent, stop = asyncio.Event(), asyncio.Event()

        async def sender():
            # After the recording, silence at the same pace until every turn has completed, as
            # a live microphone goes on sending (and the session's idle timeout never fires
            # while a busy engine is still catching up).
            chunk = RATE * CHUNK_MS // 1000 * 2
            silence = base64.b64encode(bytes(chunk)).decode()
            index = 0
            while not stop.is_set():
                offset = index * chunk
                if offset < len(pcm):
                    audio = base64.b64encode(pcm[offset : offset + chunk]).decode()
                else:
                    recording_sent.set()
                    audio = silence
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
                index += 1
                due = start + index * CHUNK_MS / 1000
                await asyncio.sleep(max(0.0, due - time.monotonic()))

        def turn(item: str) -> dict:
            return turns.setdefault(item, {"deltas": [], "completed_at": None})

        def finished() -> bool:
            done = all(t["completed_at"] is not None for t in turns.values())
            return recording_sent.is_set() and done

        task = asyncio.create_task(sender())
        async with asyncio.timeout(900):  # the busiest level's backlog
            while not finished():
                try:
                    message = await asyncio.wait_for(ws.recv(), 0.2)
                except TimeoutError:
                    if task.done():
                        task.result()  # the sender failed: say why
                    continue
                event = json.loads(message)
                now = time.monotonic() - start
                kind = event["type"]
                if kind == "error":
                    raise RuntimeError(event["error"])
                if kind == "input_audio_buffer.speech_started":
                    turn(event["item_id"])["start_s"] = event["audio_start_ms"] / 1000
                elif kind == "input_audio_buffer.speech_stopped":
                    turn(event["item_id"])["end_s"] = event["audio_end_ms"] / 1000
                elif kind == DELTA:
                    turn(event["item_id"])["deltas"].append([now, event["delta"]])
                elif kind == COMPLETED:
                    turn(event["item_id"]).update(completed_at=now, text=event["transcript"])
        stop.set()
        await task
    return sorted(turns.values(), key=lambda t: t["completed_at"])


async def level(url: str, pcm: bytes, spans, sessions: int) -> dict:
    delays = [0.0] + [random.uniform(0, 1) for _ in range(sessions - 1)]
    results = await asyncio.gather(*(session(url, pcm, d) for d in delays))
    merged = realtime_report.merge_sessions(
        [realtime_report.session_numbers(turns, spans) for turns in results]
    )
    return realtime_report.summarise_level(merged)


# ---- file uploads ------------------------------------------------------------------------------
def transcribe_file(client, base_url: str, pcm: bytes) -> tuple[str, float]:
    """/v1/audio/transcriptions of `pcm` as a WAV file: its text and upload -> text seconds."""
    started = time.perf_counter()
    reply = client.post(
        f"{base_url}/v1/audio/transcriptions",
        files={"file": ("speech.wav", wav_file(pcm, RATE), "audio/wav")},
        data={"model": MODEL, "language": "en", "response_format": "json"},
    )
    seconds = time.perf_counter() - started
    reply.raise_for_status()
    return reply.json()["text"].strip(), seconds


def file_measurements(base_url: str, pcm: bytes, spans) -> tuple[dict, dict]:
    """The whole recording's transcript and score, and each sentence's upload latency."""
    import httpx

    with httpx.Client(timeout=600) as client:
        transcribe_file(client, base_url, pcm[: 2 * RATE * 3])  # warm-up
        whole, whole_s = transcribe_file(client, base_url, pcm)
        texts, seconds = [], []
        for span in spans:
            begin, end = realtime_report.byte_range(span, RATE, *PEER_PADDING_S)
            text, took = transcribe_file(client, base_url, pcm[begin:end])
            texts.append(text)
            seconds.append(took)
    file = {"text": whole, "seconds": whole_s, **wer.word_score([" ".join(SENTENCES)], [whole])}
    peer = {"texts": texts, "seconds": seconds, "latency": realtime_report.percentiles(seconds)}
    return file, peer


def own_audio_uploads(base_url: str, pcm: bytes, one: dict) -> dict:
    """How many of the first session's completed turns equal the upload of their own audio."""
    import httpx

    with httpx.Client(timeout=600) as client:
        texts = [
            transcribe_file(
                client, base_url, pcm[slice(*realtime_report.turn_byte_range(span, RATE))]
            )[0]
            for span in one["turn_spans"][0]
        ]
    live = one["texts"][0]
    return {
        "exact": sum(a == b for a, b in zip(live, texts, strict=True)),
        "of": len(live),
        "texts": texts,
    }


# ---- main --------------------------------------------------------------------------------------
def _print_level(count: int, found: dict) -> None:
    def pair(values):
        p = realtime_report.percentiles(values)
        return (
            f"{'-':>8} {'-':>8}"
            if p is None
            else f"{p['p50'] * 1000:>8.0f} {p['p90'] * 1000:>8.0f}"
        )

    turns = f"{found['turns']}/{found['sentences']}"
    completed, first = pair(found["end_to_completed"]), pair(found["speech_to_first_delta"])
    flag = "" if found["one_turn_per_sentence"] else "  (NOT one turn per sentence)"
    print(f"{count:>8} {turns:>7} {completed} {first} {found['retracted']:>9}{flag}")


def main(argv=None) -> int:
    sys.stdout.reconfigure(line_buffering=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--out", type=Path, help="results folder (default results/realtime-...)")
    args = parser.parse_args(argv)
    random.seed(0)
    out = args.out or REPO_ROOT / "results" / f"realtime-latency-{time.strftime('%Y%m%d-%H%M%S')}"
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    pcm, spans = recording(work)
    with whisper_front(work) as front:
        url = front.url.replace("http://", "ws://") + "/v1/realtime"
        warm = asyncio.run(
            level(url, pcm, spans, 1)
        )  # warm-up: the engine's first requests are slow
        audio_s = len(pcm) / 2 / RATE
        print(f"{len(SENTENCES)} sentences per session, {audio_s:.1f} s of audio, {MODEL}")
        file, peer = file_measurements(front.url, pcm, spans)
        print("ms: end of speech -> completed (p50 p90), speech -> first delta (p50 p90)")
        print(f"{'sessions':>8} {'turns':>7} {'p50':>8} {'p90':>8} {'p50':>8} {'p90':>8} retracted")
        levels = {}
        for count in args.sessions:
            levels[str(count)] = found = asyncio.run(level(url, pcm, spans, count))
            _print_level(count, found)
        # WER at 1 session: the measured level, or the warm-up's session where 1 was not asked
        one = levels.get("1", warm)
        live_text = " ".join(one["texts"][0])
        own_audio = own_audio_uploads(front.url, pcm, one)
        results = {
            "config": {
                "model": MODEL,
                "sentences": len(SENTENCES),
                "pause_s": PAUSE_S,
                "audio_s": audio_s,
                "chunk_ms": CHUNK_MS,
                "silence_ms": SILENCE_MS,
                "sessions": args.sessions,
                "spans": spans,
            },
            "references": list(SENTENCES),
            "levels": levels,
            "wer": {
                "live": {
                    "text": live_text,
                    "from": "level 1" if "1" in levels else "warm-up",
                    **wer.word_score([" ".join(SENTENCES)], [live_text]),
                },
                "file": file,
            },
            "own_audio": own_audio,
            "peer": peer,
            "plot": "latency.png",
        }
        peer["same_as_live"] = realtime_report.same_texts(one["texts"][0], peer["texts"])
        print(realtime_report.wer_line(results["wer"]))
        print(realtime_report.own_audio_line(own_audio))
        print(realtime_report.peer_line(peer, one["end_to_completed_s"]))
        (out / "results.json").write_text(json.dumps(results, indent=1))
        realtime_report.plot(results, out / "latency.png")
        (out / "report.md").write_text(realtime_report.render(results))
        print(f"report: {out / 'report.md'}")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
