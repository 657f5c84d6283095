"""Runs calls with the official openai SDK and prints their results as JSON (one list).

Run with the SDK's own environment (scripts/openai_sdk.sh), never .venv:
    scripts/openai_sdk.sh tests/e2e/openai_sdk_client.py < plan.json
plan: {"base_url": "http://127.0.0.1:9000/v1", "calls": [{"op": ..., "args": {...}}, ...]};
a call may carry "api_key" (sent as `Authorization: Bearer`; default "unused").
Each result is {"ok": value} or {"error": {"status": HTTP status, "body": the response's JSON}}.
Op "repeat" ({"times": N, "call": a call}) answers {HTTP status: count} of N calls.
"""

import json
import sys
from pathlib import Path

import openai


def dump(value):
    return value if isinstance(value, str) else value.model_dump(exclude_none=True)


def speech(client, kind: str, args: dict):
    api = getattr(client.audio, kind)
    args = dict(args)
    with Path(args.pop("file")).open("rb") as audio:
        result = api.create(file=audio, **args)
        if args.get("stream"):
            return [dump(event) for event in result]
        return dump(result)


def chat_stream(client, args: dict):
    return [dump(chunk) for chunk in client.chat.completions.create(stream=True, **args)]


def cancel_stream(client, args: dict):
    """Read `chunks` chunks of a long streamed answer, then close the connection."""
    wanted = args.pop("chunks")
    read = 0
    with client.chat.completions.create(stream=True, **args) as stream:
        for _ in stream:
            read += 1
            if read == wanted:
                break
    return read


def realtime_transcribe(client, args: dict):
    """A transcription session with the SDK's realtime client: `pcm` (PCM16 24 kHz file) sent
    in 40 ms appends, then one manual commit; the server events up to the completed item."""
    import base64

    pcm = Path(args["pcm"]).read_bytes()
    received = []
    with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        connection.session.update(session=args["session"])
        chunk = 24000 * 40 // 1000 * 2
        for offset in range(0, len(pcm), chunk):
            audio = base64.b64encode(pcm[offset : offset + chunk]).decode()
            connection.input_audio_buffer.append(audio=audio)
        connection.input_audio_buffer.commit()
        for event in connection:
            received.append(dump(event))
            if event.type in ("conversation.item.input_audio_transcription.completed", "error"):
                break
    return received


OPS = {
    "models": lambda client, args: [model.id for model in client.models.list().data],
    "transcribe": lambda client, args: speech(client, "transcriptions", args),
    "translate": lambda client, args: speech(client, "translations", args),
    "chat": lambda client, args: dump(client.chat.completions.create(**args)),
    "chat_stream": chat_stream,
    "cancel_stream": cancel_stream,
    "realtime_transcribe": realtime_transcribe,
}


def run(clients, call: dict) -> dict:
    key = call.get("api_key") or "unused"
    if key not in clients:
        clients[key] = openai.OpenAI(base_url=clients["base_url"], api_key=key, max_retries=0)
    try:
        return {"ok": OPS[call["op"]](clients[key], dict(call.get("args", {})))}
    except openai.APIStatusError as err:
        try:
            raw = err.response.json()
        except ValueError:
            raw = err.response.text
        return {"error": {"status": err.status_code, "body": raw}}


def repeat(clients, args: dict) -> dict:
    statuses: dict[str, int] = {}
    for _ in range(args["times"]):
        result = run(clients, args["call"])
        status = "200" if "ok" in result else str(result["error"]["status"])
        statuses[status] = statuses.get(status, 0) + 1
    return statuses


def main() -> None:
    plan = json.load(sys.stdin)
    clients: dict = {"base_url": plan["base_url"]}
    results = []
    for call in plan["calls"]:
        if call["op"] == "repeat":
            results.append({"ok": repeat(clients, call["args"])})
        else:
            results.append(run(clients, call))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
