"""Runs calls with the official openai SDK and prints their results as JSON (one list).

Run with the SDK's own environment (scripts/openai_sdk.sh), never .venv:
    scripts/openai_sdk.sh tests/e2e/openai_sdk_client.py < plan.json
plan: {"base_url": "http://127.0.0.1:9000/v1", "calls": [{"op": ..., "args": {...}}, ...]}.
Each result is {"ok": value} or {"error": {"status": HTTP status, "body": the response's JSON}}.
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


OPS = {
    "models": lambda client, args: [model.id for model in client.models.list().data],
    "transcribe": lambda client, args: speech(client, "transcriptions", args),
    "translate": lambda client, args: speech(client, "translations", args),
    "chat": lambda client, args: dump(client.chat.completions.create(**args)),
    "chat_stream": chat_stream,
    "cancel_stream": cancel_stream,
}


def main() -> None:
    plan = json.load(sys.stdin)
    client = openai.OpenAI(base_url=plan["base_url"], api_key="unused", max_retries=0)
    results = []
    for call in plan["calls"]:
        try:
            results.append({"ok": OPS[call["op"]](client, dict(call.get("args", {})))})
        except openai.APIStatusError as err:
            try:
                raw = err.response.json()
            except ValueError:
                raw = err.response.text
            results.append({"error": {"status": err.status_code, "body": raw}})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
