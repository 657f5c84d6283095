"""Tenants on the OpenAI front (lora_openai.keys, quotas, auth, admin, usage): the keys file,
scopes, limits, and the app behind ApiKeyAuth with a fake gateway (no Triton, no server)."""

import hashlib
import json
import logging
import os

import pytest
import yaml
from fastapi.testclient import TestClient

from lora_openai.app import FrontSettings, create_app
from lora_openai.auth import ApiKeyAuth, Tenancy
from lora_openai.engine_load import LoadSnapshot, ServerLoad
from lora_openai.errors import OpenAIError, from_triton
from lora_openai.keys import KeyEntry, KeyLimits, KeysFile, KeysFileError, Scope, parse_keys
from lora_openai.quotas import LimitExceeded, TenantLimits
from lora_openai.triton import Reply
from tests.unit.test_openai_front import FakeGateway


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


ACME = {"name": "acme", "sha256": sha("acme-key"), "models": ["whisper_lora/alpha"]}
GLOBEX = {
    "name": "globex",
    "sha256": sha("globex-key"),
    "models": ["qwen_vl_lora/b*", "qwen_vl_lora"],
    "limits": {"requests_per_minute": 10, "tokens_per_minute": 20},
}
OPS = {"name": "ops", "sha256": sha("ops-key"), "models": ["whisper_lora/*"], "admin": True}


# ---- keys file -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw, message",
    [
        ([], "must hold `keys:`"),
        ({"keys": [{**ACME, "sha256": "abc"}]}, "sha256 must be 64 hex digits"),
        ({"keys": [{**ACME, "models": []}]}, "models must be a non-empty list"),
        ({"keys": [{**ACME, "admin": "yes"}]}, "admin must be true or false"),
        ({"keys": [{**ACME, "limits": {"rpm": 3}}]}, "unknown limit 'rpm'"),
        ({"keys": [{**ACME, "limits": {"concurrent_requests": 0}}]}, "must be an integer >= 1"),
        ({"keys": [ACME, {**GLOBEX, "name": "acme"}]}, "name 'acme' is used twice"),
        ({"keys": [ACME, {**GLOBEX, "sha256": ACME["sha256"]}]}, "the same sha256"),
        ({"keys": [{**ACME, "key": "plaintext"}]}, "unknown keys ['key']"),
    ],
)
def test_keys_file_errors(raw, message):
    with pytest.raises(KeysFileError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_keys(raw)


def test_every_problem_is_reported_at_once():
    with pytest.raises(KeysFileError) as err:
        parse_keys({"keys": [{**ACME, "sha256": "x", "models": []}]})
    assert "sha256" in str(err.value) and "models" in str(err.value)


def test_keys_are_found_by_digest_and_scoped_by_glob():
    ring = parse_keys({"keys": [ACME, GLOBEX, OPS]})
    assert ring.find("acme-key").name == "acme" and ring.find("ops-key").admin
    assert ring.find("acme-key ") is None and ring.find("") is None
    globex = ring.find("globex-key")
    assert globex.limits == KeyLimits(requests_per_minute=10, tokens_per_minute=20)
    assert globex.scope.allows("qwen_vl_lora/beta") and globex.scope.allows("qwen_vl_lora")
    assert not globex.scope.allows("qwen_vl_lora/alpha")
    assert not Scope(("whisper_lora/*",)).allows("whisper_lora")


def test_keys_file_is_reread_when_it_changes_and_a_bad_file_keeps_the_old_keys(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump({"keys": [ACME]}))
    now = [0.0]
    keys = KeysFile(path, clock=lambda: now[0])
    assert keys.current().find("acme-key") and not keys.current().find("ops-key")
    path.write_text(yaml.safe_dump({"keys": [ACME, OPS]}))
    os.utime(path, ns=(1, 1))
    assert not keys.current().find("ops-key")  # checked at most once a second
    now[0] = 2.0
    assert keys.current().find("ops-key")
    path.write_text("keys: [ {name: broken")
    now[0] = 4.0
    assert keys.current().find("ops-key")  # still the last good keys


# ---- limits --------------------------------------------------------------------------------------
def key(**limits) -> KeyEntry:
    return KeyEntry("t", b"\0" * 32, Scope(("*",)), limits=KeyLimits(**limits))


def test_requests_per_minute_and_concurrency():
    limits = TenantLimits()
    tenant = key(requests_per_minute=2, concurrent_requests=1)
    with limits.request(tenant):
        with pytest.raises(LimitExceeded, match="1 concurrent"), limits.request(tenant):
            pass
    with limits.request(tenant):
        pass
    with pytest.raises(LimitExceeded, match="2 requests per minute") as err:
        with limits.request(tenant):
            pass
    assert err.value.status == 429 and 1 <= err.value.retry_after_s <= 60
    assert err.value.headers() == {"Retry-After": str(err.value.retry_after_s)}
    assert limits.running("t") == 0
    with limits.request(key(requests_per_minute=1)):  # another key has its own window
        pass


def test_audio_seconds_and_tokens_per_minute():
    limits = TenantLimits()
    tenant = key(audio_seconds_per_minute=10, tokens_per_minute=5)
    limits.audio(tenant, 6.2)
    with pytest.raises(LimitExceeded, match="10 audio seconds"):
        limits.audio(tenant, 4)
    with pytest.raises(OpenAIError, match="at most 10 audio seconds") as err:
        limits.audio(tenant, 11)
    assert err.value.status == 400
    with limits.request(tenant):
        limits.tokens(tenant, 9)  # more than the window holds: it is full now
    with pytest.raises(LimitExceeded, match="5 tokens per minute"), limits.request(tenant):
        pass


# ---- the app behind ApiKeyAuth -------------------------------------------------------------------
class TenantGateway(FakeGateway):
    def __init__(self, url):
        super().__init__(url)
        self.adapters = {"whisper_lora": ["alpha", "beta"], "qwen_vl_lora": ["alpha", "beta"]}
        self.commands = []

    async def stream(self, model, fields, parameters=None):
        if parameters == {"lora_name": "beta"} and model == "whisper_lora":
            raise from_triton("unknown adapter 'beta'; available: alpha, gamma")
        async for reply in super().stream(model, fields, parameters):
            yield reply

    async def complete(self, model, fields, parameters=None):
        self.commands.append((model, fields["adapter_command"], parameters))
        if "missing" in fields["adapter_command"]:
            raise from_triton("adapter folder 'missing' not found under the adapter roots")
        return Reply({"text_output": json.dumps({"model": model, "loaded": "x"})}, True)


class NoLoad:
    def __init__(self, url):
        pass

    async def read(self):
        return LoadSnapshot(ServerLoad(), 0.0)

    async def close(self):
        pass


@pytest.fixture
def front(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump({"keys": [ACME, GLOBEX, OPS]}))
    gateways = []

    def factory(url):
        gateways.append(TenantGateway(url))
        return gateways[-1]

    tenancy = Tenancy(api_keys_file=path)
    app = create_app(FrontSettings(), factory, NoLoad, tenancy=tenancy)
    with TestClient(ApiKeyAuth(app, tenancy)) as client:
        yield client, gateways[0]


def auth(name: str) -> dict:
    return {"Authorization": f"Bearer {name}-key"}


def transcribe(client, model: str, headers: dict):
    files = {"file": ("a.wav", b"RIFF", "audio/wav")}
    return client.post(
        "/v1/audio/transcriptions", data={"model": model}, files=files, headers=headers
    )


def test_keys_scopes_and_listing(front):
    client, _ = front
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic acme-key"}):
        response = client.get("/v1/models", headers=headers)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert client.get("/health").status_code == 200  # probes need no key
    ids = [m["id"] for m in client.get("/v1/models", headers=auth("globex")).json()["data"]]
    assert ids == ["qwen_vl_lora", "qwen_vl_lora/beta"]
    assert transcribe(client, "whisper_lora/alpha", auth("acme")).json() == {
        "text": " Hello world."
    }
    # another tenant's model answers exactly as a model that does not exist
    other = transcribe(client, "whisper_lora/alpha", auth("globex"))
    missing = transcribe(client, "whisper_lora/nothing", auth("globex"))
    assert other.status_code == missing.status_code == 404
    assert other.json() == json.loads(
        json.dumps(missing.json()).replace("whisper_lora/nothing", "whisper_lora/alpha")
    )
    assert "qwen_vl_lora/beta" in other.json()["error"]["message"]
    assert "alpha" not in other.json()["error"]["message"].replace("whisper_lora/alpha", "")
    for path in ("/v1/models/whisper_lora/alpha", "/v1/models/qwen_vl_lora/alpha"):
        assert client.get(path, headers=auth("globex")).status_code == 404


def test_triton_errors_name_only_the_callers_models(front):
    client, _ = front
    ops = transcribe(client, "whisper_lora/beta", auth("ops"))  # Triton: unknown adapter
    assert ops.status_code == 404
    message = ops.json()["error"]["message"]
    assert "gamma" not in message and "whisper_lora/alpha" in message
    assert "qwen_vl_lora" not in message


def test_limits_answer_429_with_retry_after(front):
    client, _ = front
    body = {"model": "qwen_vl_lora/beta", "messages": [{"role": "user", "content": "Hi"}]}
    first = client.post("/v1/chat/completions", json=body, headers=auth("globex"))
    assert first.status_code == 200 and first.json()["usage"]["total_tokens"] == 13
    second = client.post("/v1/chat/completions", json=body, headers=auth("globex"))
    assert second.status_code == 200  # 13 of 20 tokens used: admitted, then the budget is full
    third = client.post("/v1/chat/completions", json=body, headers=auth("globex"))
    assert third.status_code == 429 and int(third.headers["retry-after"]) >= 1
    assert third.json()["error"]["code"] == "rate_limit_exceeded"
    assert "tokens per minute" in third.json()["error"]["message"]
    assert transcribe(client, "whisper_lora/alpha", auth("acme")).status_code == 200


def test_usage_per_key_and_model_on_metrics(front):
    client, _ = front
    transcribe(client, "whisper_lora/alpha", auth("acme"))
    transcribe(client, "whisper_lora/alpha", auth("globex"))
    client.get("/v1/models", headers={"Authorization": "Bearer wrong"})
    body = {"model": "qwen_vl_lora/beta", "messages": [{"role": "user", "content": "Hi"}]}
    client.post("/v1/chat/completions", json=body, headers=auth("globex"))
    metrics = client.get("/metrics", headers=auth("ops")).text
    assert 'lora_openai_requests_total{key="acme",model="whisper_lora/alpha",status="200"} 1.0' in (
        metrics
    )
    assert 'lora_openai_requests_total{key="globex",model="",status="404"} 1.0' in metrics
    assert 'lora_openai_requests_total{key="(no key)",model="",status="401"} 1.0' in metrics
    assert 'lora_openai_prompt_tokens_total{key="globex",model="qwen_vl_lora/beta"} 12.0' in (
        metrics
    )
    assert (
        'lora_openai_completion_tokens_total{key="globex",model="qwen_vl_lora/beta"} 1.0' in metrics
    )
    assert 'lora_openai_audio_seconds_total{key="acme",model="whisper_lora/alpha"}' in metrics


def test_metrics_name_every_tenant_so_only_an_admin_key_reads_them(front):
    client, _ = front
    assert client.get("/metrics").status_code == 401
    refused = client.get("/metrics", headers=auth("acme"))
    assert refused.status_code == 403 and "acme" not in refused.text
    assert client.get("/metrics", headers=auth("ops")).status_code == 200
    assert client.get("/health").status_code == 200  # probes need no key


def test_admin_api(front, caplog):
    client, gateway = front
    load = {"lora_name": "whisper_lora/gamma", "lora_path": "gamma dir"}
    assert client.post("/v1/load_lora_adapter", json=load, headers=auth("acme")).status_code == 403
    assert client.post("/v1/load_lora_adapter", json=load).status_code == 401
    with caplog.at_level(logging.INFO, logger="lora_openai.audit"):
        response = client.post("/v1/load_lora_adapter", json=load, headers=auth("ops"))
        assert response.status_code == 200 and "gamma" in response.text
        unload = {"lora_name": "whisper_lora/gamma"}
        response = client.post("/v1/unload_lora_adapter", json=unload, headers=auth("ops"))
        assert response.status_code == 200
        missing = {"lora_name": "whisper_lora/missing"}
        response = client.post("/v1/load_lora_adapter", json=missing, headers=auth("ops"))
        assert response.status_code == 400
        outside = {"lora_name": "qwen_vl_lora/beta"}  # not in the admin key's scope
        response = client.post("/v1/unload_lora_adapter", json=outside, headers=auth("ops"))
        assert response.status_code == 404
    assert [c[:2] for c in gateway.commands] == [
        ("whisper_lora", "load gamma 'gamma dir'"),
        ("whisper_lora", "unload gamma"),
        ("whisper_lora", "load missing"),
    ]
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "lora_openai.audit"]
    assert [(r["who"], r["action"], r["model"], r["result"]) for r in lines] == [
        ("ops", "load", "whisper_lora/gamma", "ok"),
        ("ops", "unload", "whisper_lora/gamma", "ok"),
        ("ops", "load", "whisper_lora/missing", "refused"),
    ]
    assert all(r["at"].endswith("+00:00") for r in lines)
    assert "ops-key" not in caplog.text


def test_without_keys_everyone_is_served_and_the_admin_api_is_shut():
    tenancy = Tenancy()
    assert "no API keys" in tenancy.describe()
    app = create_app(FrontSettings(), TenantGateway, NoLoad, tenancy=tenancy)
    with TestClient(ApiKeyAuth(app, tenancy)) as client:
        assert len(client.get("/v1/models").json()["data"]) == 6
        load = {"lora_name": "whisper_lora/gamma"}
        response = client.post("/v1/load_lora_adapter", json=load)
        assert response.status_code == 403 and "--api-key" in response.json()["error"]["message"]
