"""Tenants on the real front and the shared tritonserver (whisper_lora), the official openai SDK
as the client (scripts/openai_sdk.sh): keys scoped to adapters, refusals that name only the
caller's models, 2,000 refused requests that leave the good tenant served, the admin API with
its audit log, and Triton's own port refusing load/unload without the control token.

The front runs as `make serve` starts it, with `--api-keys-file`; the control token is the
session's ($LORA_CONTROL_TOKEN, tests/conftest.py), which the front inherits.
"""

import hashlib
import json
import os
import re
import urllib.error
import urllib.request

import pytest
import yaml
from lora_client.requests import (
    CONTROL_TOKEN_VARIABLE,
    RequestError,
    adapter_command,
    grpc_stream,
    transcription_fields,
)

from tests.conftest import only_with_model
from tests.e2e.test_openai_api import SENTENCE, call, front_on, ok, sdk_runner
from tests.e2e.triton_calls import grpc_one

pytestmark = only_with_model("whisper_lora")
WHISPER = "whisper_lora"
KEYS = {
    "acme": {"models": ["whisper_lora/alpha"]},
    "globex": {"models": ["whisper_lora/beta"]},
    "ops": {"models": ["whisper_lora/*"], "admin": True},
}
REFUSED = 1000


def secret(name: str) -> str:
    return f"{name}-test-key-0123456789"


@pytest.fixture(scope="module")
def front(triton_server, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tenants")
    keys = folder / "keys.yaml"
    entries = [
        {"name": name, "sha256": hashlib.sha256(secret(name).encode()).hexdigest(), **entry}
        for name, entry in KEYS.items()
    ]
    keys.write_text(yaml.safe_dump({"keys": entries}))
    with front_on(triton_server, folder, api_keys_file=keys) as server:
        yield server


@pytest.fixture(scope="module")
def sdk_run(request, front):
    return sdk_runner(request, f"{front.url}/v1")


def as_tenant(name: str | None, op: str, **args) -> dict:
    return {**call(op, **args), "api_key": secret(name) if name else "wrong-key"}


def post(front, path: str, body: dict, key: str | None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {secret(key)}"
    request = urllib.request.Request(
        f"{front.url}{path}", json.dumps(body).encode(), headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_tenants_see_and_use_only_their_models(sdk_run, front, grpc_url, speech, tmp_path):
    path = speech(SENTENCE)
    wav = str(path)
    small = tmp_path / "small.wav"  # refused before it is decoded: a little upload will do
    small.write_bytes(path.read_bytes()[:2048])
    alpha_ref = grpc_one(grpc_url, WHISPER, transcription_fields(path), {"lora_name": "alpha"}).text
    (
        acme_models,
        globex_models,
        acme_text,
        other,
        missing,
        no_key,
        wrong_keys,
        other_tenant,
        after,
    ) = sdk_run(
        as_tenant("acme", "models"),
        as_tenant("globex", "models"),
        as_tenant("acme", "transcribe", file=wav, model=f"{WHISPER}/alpha"),
        as_tenant("globex", "transcribe", file=wav, model=f"{WHISPER}/alpha"),
        as_tenant("globex", "transcribe", file=wav, model=f"{WHISPER}/nothing"),
        {**call("models"), "api_key": "unused"},
        {"op": "repeat", "args": {"times": REFUSED, "call": as_tenant(None, "models")}},
        {
            "op": "repeat",
            "args": {
                "times": REFUSED,
                "call": as_tenant(
                    "globex", "transcribe", file=str(small), model=f"{WHISPER}/alpha"
                ),
            },
        },
        as_tenant("acme", "transcribe", file=wav, model=f"{WHISPER}/alpha"),
    )
    assert ok(acme_models) == [f"{WHISPER}/alpha"]
    assert ok(globex_models) == [f"{WHISPER}/beta"]
    assert ok(acme_text)["text"] == ok(after)["text"] == alpha_ref
    # another tenant's adapter: exactly the answer for one that does not exist
    assert other["error"]["status"] == missing["error"]["status"] == 404
    as_missing = json.dumps(missing["error"]["body"]).replace(f"{WHISPER}/nothing", "@")
    assert json.dumps(other["error"]["body"]).replace(f"{WHISPER}/alpha", "@") == as_missing
    assert re.findall(r"whisper_lora/\w+", other["error"]["body"]["error"]["message"]) == [
        f"{WHISPER}/alpha",  # the name it asked for
        f"{WHISPER}/beta",  # its own
    ]
    assert no_key["error"]["status"] == 401
    assert no_key["error"]["body"]["error"]["code"] == "invalid_api_key"
    assert ok(wrong_keys) == {"401": REFUSED} and ok(other_tenant) == {"404": REFUSED}
    scrape = urllib.request.Request(
        f"{front.url}/metrics", headers={"Authorization": f"Bearer {secret('ops')}"}
    )
    with urllib.request.urlopen(scrape, timeout=10) as response:
        metrics = response.read().decode()
    assert f'lora_openai_requests_total{{key="globex",model="",status="404"}} {REFUSED + 2}.0' in (
        metrics
    )
    assert 'lora_openai_requests_total{key="acme",model="whisper_lora/alpha",status="200"} 2.0' in (
        metrics
    )
    assert 'lora_openai_audio_seconds_total{key="acme",model="whisper_lora/alpha"}' in metrics


def test_admin_api_and_tritons_control_token(sdk_run, front, grpc_url, speech):
    for change in ("unload beta", "load beta"):
        with pytest.raises(RequestError, match="needs this model's control token"):
            adapter_command(grpc_url, "grpc", WHISPER, change, token="")
    names_only = adapter_command(grpc_url, "grpc", WHISPER, "list", token="")
    assert {"name": "beta"} in names_only["adapters"] and set(names_only) == {"model", "adapters"}
    # The token as a gRPC header (tritonserver --grpc-header-forward-pattern, as the launcher
    # and the image's entrypoint start it), not in the request: `load beta` reloads it.
    before = adapter_command(grpc_url, "grpc", WHISPER, "list")
    (version,) = [a["version"] for a in before["adapters"] if a["name"] == "beta"]
    token = os.environ[CONTROL_TOKEN_VARIABLE]
    fields = {"adapter_command": "load beta"}
    (reply,) = grpc_stream(grpc_url, WHISPER, fields, headers={"control_token": token})
    assert json.loads(reply.outputs["text_output"][0])["version"] == version + 1
    with pytest.raises(RequestError, match="needs this model's control token"):
        list(grpc_stream(grpc_url, WHISPER, fields, headers={"control_token": "wrong"}))

    wav = str(speech(SENTENCE))
    beta = {"lora_name": f"{WHISPER}/beta"}
    try:
        assert post(front, "/v1/unload_lora_adapter", beta, "acme")[0] == 403
        assert post(front, "/v1/unload_lora_adapter", beta, None)[0] == 401
        assert post(front, "/v1/unload_lora_adapter", beta, "ops") == (
            200,
            f"Success: LoRA adapter '{WHISPER}/beta' removed successfully.",
        )
        (gone,) = sdk_run(as_tenant("globex", "transcribe", file=wav, model=f"{WHISPER}/beta"))
        assert gone["error"]["status"] == 404
        assert post(front, "/v1/load_lora_adapter", beta, "ops")[0] == 200
        (back,) = sdk_run(as_tenant("globex", "transcribe", file=wav, model=f"{WHISPER}/beta"))
        assert ok(back)["text"]
    finally:  # the other tests' beta, whatever happened here
        if "beta" not in str(adapter_command(grpc_url, "grpc", WHISPER, "list")):
            adapter_command(grpc_url, "grpc", WHISPER, "load beta")
    log = front.log_path.read_text()
    lines = [line for line in log.splitlines() if "lora_openai.audit INFO " in line]
    audit = [json.loads(line.split(" INFO ", 1)[1]) for line in lines]
    assert [(a["who"], a["action"], a["model"], a["result"]) for a in audit] == [
        ("ops", "unload", f"{WHISPER}/beta", "ok"),
        ("ops", "load", f"{WHISPER}/beta", "ok"),
    ]
    assert not any(secret(name) in log for name in KEYS)
