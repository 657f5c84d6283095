"""The admin API in vLLM's shapes: load and unload adapters at runtime.

  POST /v1/load_lora_adapter    {"lora_name": "whisper_lora/acme-1", "lora_path": "acme-1"}
  POST /v1/unload_lora_adapter  {"lora_name": "whisper_lora/acme-1"}

`lora_name` is the model id (`<triton model>/<adapter>`), in the admin key's scope; `lora_path`
is a folder on the Triton host inside one of the model's adapter roots, or an
`s3://bucket/prefix/folder/` directly under an object-storage root (relative: to the first
root; absent: reload from the root or multi_lora.json). Each maps to the model's
`adapter_command` `load NAME [PATH]` / `unload NAME` over gRPC, so the fleet checks the adapter
as for any load. Only admin keys get here (lora_openai.auth answers 403 to the others). Every
change is one JSON line on the `lora_openai.audit` logger: when, who (the key's name), what,
result.
"""

import json
import logging
import shlex
from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from lora_openai.auth import caller_of, note_model
from lora_openai.errors import OpenAIError, bad_request
from lora_openai.front import front_of
from lora_openai.models import BASE_MODELS, parse_model_id

audit = logging.getLogger("lora_openai.audit")
router = APIRouter()


async def _body(request: Request, fields: tuple[str, ...]) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise bad_request("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise bad_request(f"unknown fields {unknown}; allowed: {', '.join(fields)}")
    for name in fields:
        value = body.get(name)
        if value is not None and (not isinstance(value, str) or not value):
            raise bad_request(f"'{name}' must be a non-empty string", name)
    if not body.get("lora_name"):
        raise bad_request("'lora_name' is required (the adapter's model id)", "lora_name")
    return body


async def change(request: Request, action: str, name: str, path: str | None):
    """One adapter command for the model id `name`, sent with the models' control token."""
    caller = caller_of(request)
    front = front_of(request)
    catalog = front.catalog
    model = parse_model_id(name)
    if model.adapter is None or model.triton_model not in BASE_MODELS:
        raise bad_request(
            f"'lora_name' must be an adapter's model id, <model>/<adapter>, with <model> "
            f"one of {', '.join(BASE_MODELS)}",
            "lora_name",
        )
    if not caller.scope.allows(model.id):
        raise await catalog.not_found(model.id, caller.scope)
    note_model(request, model.id)
    words = [action, model.adapter, *([path] if path else [])]
    record = {
        "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "who": caller.name,
        "action": action,
        "model": model.id,
        **({"path": path} if path else {}),
    }
    try:
        reply = await front.gateway.complete(
            model.triton_model,
            {"adapter_command": shlex.join(words)},
            front.settings.control_parameters(),
        )
    except OpenAIError as err:
        audit.info(json.dumps({**record, "result": "refused", "error": err.message}))
        raise
    await catalog.listing(fresh=True)
    audit.info(json.dumps({**record, "result": "ok"}))
    return json.loads(reply.outputs.get("text_output") or "{}")


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request):
    body = await _body(request, ("lora_name", "lora_path"))
    await change(request, "load", body["lora_name"], body.get("lora_path"))
    return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' added successfully.")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request):
    body = await _body(request, ("lora_name",))
    await change(request, "unload", body["lora_name"], None)
    return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' removed successfully.")
