"""Drives /v1/realtime with the `websockets` library and prints what came back as JSON.

Run with the openai SDK's environment (scripts/openai_sdk.sh; `websockets` is pinned there),
never .venv, as a user's own client would:
    scripts/openai_sdk.sh tests/e2e/realtime_ws_client.py < plan.json
plan: {"url": "ws://127.0.0.1:PORT/v1/realtime", "sessions": [session, ...]}; the sessions run
concurrently. A session: {"query": "?intent=transcription", "api_key": KEY or null, "steps":
[...]}, each step one of
  {"send": event}                                    one client event
  {"stream": PCM16 file, "rate": Hz, "chunk_ms": 40} the file's audio (or its first "seconds")
                                                     in base64 chunks at real-time pace
  {"wait_for": server event type, "count": N}        until N events of that type have arrived
  {"wait_until_completed": true}                     until every committed item is completed
  {"sleep": seconds}                                 wait
  {"close": true}                                    close the socket now
Result per session: {"events": [server event + "t" (s since the session began)], "closed":
close code or null, "reason": close reason or null, "refused": HTTP status of a refused handshake
or null}. Once the server closes the socket the remaining steps are skipped.
"""

import asyncio
import base64
import json
import sys
import time
from pathlib import Path

import websockets

TIMEOUT_S = 90


async def session(url: str, spec: dict) -> dict:
    headers = {"Authorization": f"Bearer {spec['api_key']}"} if spec.get("api_key") else {}
    received: list[dict] = []
    result = {"events": received, "closed": None, "reason": None, "refused": None}
    began = time.monotonic()
    try:
        ws = await websockets.connect(url + spec.get("query", ""), additional_headers=headers)
    except websockets.InvalidStatus as refused:
        result["refused"] = refused.response.status_code
        return result
    arrived = asyncio.Condition()

    async def reader():
        try:
            async for message in ws:
                event = json.loads(message)
                event["t"] = round(time.monotonic() - began, 3)
                async with arrived:
                    received.append(event)
                    arrived.notify_all()
        except websockets.ConnectionClosed:
            pass
        result["closed"], result["reason"] = ws.close_code, ws.close_reason
        async with arrived:
            arrived.notify_all()

    async def until(condition):
        async with arrived:
            await asyncio.wait_for(
                arrived.wait_for(lambda: condition() or ws.close_code), TIMEOUT_S
            )

    def count(kind):
        return sum(event["type"] == kind for event in received)

    def all_completed():
        committed = {e["item_id"] for e in received if e["type"] == "input_audio_buffer.committed"}
        done = {
            e["item_id"]
            for e in received
            if e["type"] == "conversation.item.input_audio_transcription.completed"
        }
        return committed <= done

    task = asyncio.create_task(reader())
    try:
        for step in spec["steps"]:
            if "send" in step:
                await ws.send(json.dumps(step["send"]))
            elif "stream" in step:
                pcm = Path(step["stream"]).read_bytes()
                if "seconds" in step:  # only the first seconds of the file
                    pcm = pcm[: int(step["seconds"] * step["rate"]) * 2]
                chunk = int(step["rate"] * step.get("chunk_ms", 40) / 1000) * 2
                start = time.monotonic()
                for index, offset in enumerate(range(0, len(pcm), chunk)):
                    audio = base64.b64encode(pcm[offset : offset + chunk]).decode()
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
                    due = start + (index + 1) * step.get("chunk_ms", 40) / 1000
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
            elif "wait_for" in step:
                await until(lambda s=step: count(s["wait_for"]) >= s.get("count", 1))
            elif step.get("wait_until_completed"):
                await until(all_completed)
            elif "sleep" in step:
                await asyncio.sleep(step["sleep"])
            elif step.get("close"):
                break
    except websockets.ConnectionClosed:
        pass  # the server closed the session: the result says how
    await ws.close()
    await task
    return result


async def main(plan: dict) -> list:
    return await asyncio.gather(*(session(plan["url"], spec) for spec in plan["sessions"]))


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.load(sys.stdin)))))
