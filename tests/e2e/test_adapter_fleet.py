"""Adapters as a live fleet on the shared tritonserver (qwen_vl_lora, the repository's
model.json): folders added to, replaced in and removed from the adapter root while requests
flow, 32 adapters served concurrently with max_loras 4, every refusal with its message, the
listing, and unload / load through adapter_command requests.

Every served text is compared with the merged-weights reference token for token. Adapters are
built in tmp folders and copied into the root atomically (a dot-folder renamed into place, as
the README tells operators); every folder a test adds is removed again and the model rescanned,
so the other tests see the repository's adapters only. The root is shared by every server
started from this checkout, so names carry this run's process id and assertions only look at
this run's adapters.
"""

import functools
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from lora_client.requests import RequestError, adapter_command, grpc_stream

from tests.conftest import QWEN_VL_S3_ROOT, REPO
from tests.e2e.test_qwen_vl_lora import chat_prompt, rgb
from tests.e2e.test_serving_stack import PROMPT, png, qwen_inputs
from tests.e2e.triton_calls import grpc_many, grpc_one, sampling

MODEL = "qwen_vl_lora"
ROOT = REPO / "adapters" / MODEL  # serving.adapters.roots in the repository's model.json
PREFIX = f"fleet{os.getpid()}"  # every adapter this run adds starts with it
STALE_S = 3 * 3600  # folders of crashed earlier runs are removed after this
MAX_TOKENS = 16
FLEET_TOKENS = 8  # 32 references to compute: the tokens that prove each adapter, no more
# Long enough to still be running while the adapter changes (~10 s here), all of them
# generated (end of text ignored: a story the adapter ends early would finish first).
LONG_TOKENS = 1200
STORY = "Tell me a long story."


# ---- helpers (shared with the other test_adapter_* modules) --------------------------------------
def command(grpc_url: str, text: str, model: str = MODEL) -> dict:
    return adapter_command(grpc_url, "grpc", model, text)


def served(grpc_url: str, model: str = MODEL) -> dict[str, dict]:
    return {item["name"]: item for item in command(grpc_url, "list", model)["adapters"]}


def publish(folder: Path, name: str, root: Path = ROOT) -> Path:
    """Copy an adapter folder into the root under `name`, atomically (dot-folder, rename)."""
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".{name}.incoming"
    shutil.copytree(folder, staging, symlinks=True)
    target = root / name
    staging.rename(target)
    return target


def replace_file(source: Path, target: Path) -> None:
    """Replace one file of a served folder atomically (copy beside it, then rename)."""
    incoming = target.with_name(f".{target.name}.incoming")
    shutil.copyfile(source, incoming)
    os.replace(incoming, target)


def retract(name: str, root: Path = ROOT) -> None:
    """Take a folder out of the root atomically, then delete it."""
    target = root / name
    if target.is_symlink():
        target.unlink()
    elif target.exists():
        hidden = root / f".{name}.outgoing"
        target.rename(hidden)
        shutil.rmtree(hidden)


def clear_root(root: Path = ROOT) -> None:
    """Remove this run's folders from the root, and test folders a crashed run left behind."""
    if not root.is_dir():
        return
    for entry in root.iterdir():
        name = entry.name.lstrip(".")
        stale = time.time() - entry.lstat().st_mtime > STALE_S
        if not (PREFIX in name or (name.startswith(("fleet", "bad name")) and stale)):
            continue
        if entry.name.startswith(".") and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            retract(entry.name, root)


def qwen_adapters(base: Path, out: Path, names, *, seed: int, rank: int = 8) -> Path:
    """out/<name> for each name. The weights follow the seed and the name without this run's
    PREFIX (a pid): every run tests the same adapters, not ones that vary with the pid."""
    from lora_tools.demo.qwen_vl import make_qwen_vl_adapters

    built = out / ".built"
    stable = {name: stable_name(name) for name in names}
    make_qwen_vl_adapters(base, built, names=tuple(stable.values()), rank=rank, seed=seed)
    for name, built_name in stable.items():
        (built / built_name).rename(out / name)
    return out


def stable_name(name: str) -> str:
    return name.replace(PREFIX, "fleet")


@functools.lru_cache(maxsize=4)
def _prompt_and_tokenizer(base: Path, images: int):
    from lora_serving.tasks import load_tokenizer

    return chat_prompt(base, PROMPT, images=images), load_tokenizer(str(base))


def reference(
    base: Path, adapter: Path | None, max_tokens: int = MAX_TOKENS, image: bool = True
) -> str:
    """The merged reference's completion of qwen_inputs()' prompt and image (or no image)."""
    import torch

    from tests.reference.qwen_vl import reference_generate, streamed_text

    prompt, tokenizer = _prompt_and_tokenizer(base, int(image))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's matmuls gain nothing from the server's cores
    try:
        tokens, _ = reference_generate(
            base, adapter, prompt, [rgb(png())] if image else [], max_tokens
        )
    finally:
        torch.set_num_threads(threads)
    return streamed_text(tokenizer, tokens)


def ask(grpc_url: str, name: str | None, max_tokens: int = MAX_TOKENS):
    fields = qwen_inputs(sampling_parameters=sampling(max_tokens=max_tokens))
    return grpc_one(grpc_url, MODEL, fields, {"lora_name": name} if name else None)


class Streaming:
    """One streamed text request on its own thread; `started` is set with its first delta."""

    def __init__(self, grpc_url: str, name: str):
        self.started = threading.Event()
        self.parts: list[str] = []
        self.error: str | None = None
        fields = {
            "text_input": STORY,
            "exclude_input_in_output": True,
            "stream": True,
            "sampling_parameters": sampling(max_tokens=LONG_TOKENS, ignore_eos=True),
        }
        self._thread = threading.Thread(
            target=self._run, args=(grpc_url, fields, {"lora_name": name}), daemon=True
        )
        self._thread.start()
        assert self.started.wait(60), "the streamed request never started"

    def _run(self, grpc_url, fields, parameters):
        try:
            for reply in grpc_stream(grpc_url, MODEL, fields, parameters):
                self.parts.append(reply.outputs["text_output"][0])
                self.started.set()
        except RequestError as err:
            self.error = str(err)
        finally:
            self.started.set()

    @property
    def ended(self) -> bool:
        return not self._thread.is_alive()

    def text(self) -> str:
        self._thread.join(120)
        assert self.error is None, self.error
        return "".join(self.parts)


@pytest.fixture(scope="module")
def qwen2_base(demo_models) -> Path:
    return demo_models / "qwen2-vl-tiny"


@pytest.fixture(scope="module", autouse=True)
def clean_root(grpc_url):
    """Start and end with none of this module's folders in the root, and the model rescanned."""
    clear_root()
    ROOT.mkdir(parents=True, exist_ok=True)
    command(grpc_url, "rescan")
    yield
    clear_root()
    command(grpc_url, "rescan")
    for name in command(grpc_url, "list")["unloaded"]:
        command(grpc_url, f"load {name}")
    for name in [name for name in served(grpc_url) if PREFIX in name]:
        # Loaded by a command in a test that failed before unloading it: a failure there
        # must not spill into later modules.
        command(grpc_url, f"unload {name}")
    assert {"alpha", "beta"} <= set(served(grpc_url))
    assert not [name for name in served(grpc_url) if PREFIX in name]


# ---- listing -------------------------------------------------------------------------------------
def test_list_shows_rank_modules_source_and_state_over_grpc_and_http(grpc_url, http_url):
    assert ask(grpc_url, "alpha").error is None  # alpha is now in an engine slot
    over_http = adapter_command(http_url, "http", MODEL, "list")
    listing = command(grpc_url, "list")
    assert over_http["adapters"] == listing["adapters"]
    alpha = {item["name"]: item for item in listing["adapters"]}["alpha"]
    assert alpha["state"] == "loaded"
    assert alpha["rank"] == 8 and "self_attn" in alpha["target_modules"][0]
    assert alpha["source"] == "multi_lora.json" and alpha["path"].endswith(
        "qwen2-vl-adapters/alpha"
    )
    assert listing["limits"] == {"max_loras": 4, "max_cpu_loras": 8, "max_lora_rank": 16}
    # serving.adapters.pinned in model.json: pinned in the real engine's adapter cache
    # (engine.lora_slots' worker extension), the others not.
    assert listing["pinned"] == ["alpha"]
    pins = {item["name"]: item["pinned"] for item in listing["adapters"]}
    assert pins["alpha"] is True and not any(p for name, p in pins.items() if name != "alpha")
    assert listing["roots"] == [
        {"path": str(ROOT), "exists": True},
        {"path": QWEN_VL_S3_ROOT, "exists": True},  # serving.adapters.roots_env
    ]
    assert listing["model"] == MODEL


def test_list_adapters_command_line(grpc_url, capsys):
    from lora_client.cli import main

    assert main(["list-adapters", "--url", grpc_url, "--model", MODEL]) == 0
    out = capsys.readouterr().out
    assert out.startswith("qwen_vl_lora (max_loras 4, max_cpu_loras 8, max_lora_rank 16)")
    assert "alpha" in out and "multi_lora.json" in out
    alpha_row = next(line for line in out.splitlines() if line.split()[:1] == ["alpha"])
    assert " pinned " in alpha_row  # serving.adapters.pinned in model.json


# ---- add, replace, remove while requests run -----------------------------------------------------
def test_add_replace_remove_while_requests_run(grpc_url, qwen2_base, tmp_path):
    name = f"{PREFIX}_live"
    v1 = qwen_adapters(qwen2_base, tmp_path / "v1", [name], seed=21) / name
    v2 = qwen_adapters(qwen2_base, tmp_path / "v2", [name], seed=22) / name
    with pytest.raises(RequestError, match=f"unknown adapter '{name}'"):
        command(grpc_url, f"unload {name}")

    publish(v1, name)
    command(grpc_url, "rescan")
    assert served(grpc_url)[name]["version"] == 1
    assert ask(grpc_url, name).text == reference(qwen2_base, v1)
    # A long request's output on version 1 alone: what one running across the change must give.
    started = time.monotonic()
    long_v1 = Streaming(grpc_url, name).text()
    long_v1_s = time.monotonic() - started

    running = Streaming(grpc_url, name)  # on version 1 while its weights are replaced
    started = time.monotonic()
    replace_file(v2 / "adapter_model.safetensors", ROOT / name / "adapter_model.safetensors")
    command(grpc_url, "rescan")
    listing = command(grpc_url, "list")
    took = time.monotonic() - started
    assert {item["name"]: item["version"] for item in listing["adapters"]}[name] == 2
    retiring = [(item["name"], item["in_flight"]) for item in listing["retiring"]]
    assert retiring == [(name, 1)], (
        f"{retiring}: the change and listing took {took:.2f} s; the running request "
        f"{'had ended' if running.ended else 'was still running'} (alone it ran {long_v1_s:.1f} s)"
    )
    assert running.text() == long_v1
    assert ask(grpc_url, name).text == reference(qwen2_base, v2)
    assert command(grpc_url, "list")["retiring"] == []
    long_v2 = Streaming(grpc_url, name).text()
    assert long_v2 != long_v1

    running = Streaming(grpc_url, name)  # on version 2 while its folder is removed
    retract(name)
    command(grpc_url, "rescan")
    assert name not in served(grpc_url)
    assert running.text() == long_v2
    after = ask(grpc_url, name)
    assert f"unknown adapter '{name}'; available: alpha, beta" in after.error


def test_a_new_folder_is_picked_up_without_a_command(grpc_url, qwen2_base, tmp_path):
    """serving.adapters.rescan_interval_s (5 s in the repository's model.json)."""
    name = f"{PREFIX}_dropped"
    folder = qwen_adapters(qwen2_base, tmp_path, [name], seed=5) / name
    publish(folder, name)
    deadline = time.monotonic() + 20
    while name not in served(grpc_url):
        assert time.monotonic() < deadline, "the periodic rescan did not add the folder"
        time.sleep(0.5)
    assert ask(grpc_url, name).text == reference(qwen2_base, folder)
    retract(name)


def test_an_adapter_in_object_storage_is_served_replaced_and_removed(
    grpc_url, qwen2_base, tmp_path, object_store, triton_server
):
    """A bucket prefix as a root (QWEN_VL_S3_ROOT, moto's S3-API server): each version is
    downloaded into the model's snapshot, checked, and served equal to its merged reference;
    a pickle, a rank over max_lora_rank and a key with '..' are refused with their reasons; a
    request running on version 1 finishes on it while version 2 replaces it; with the store
    stopped the adapter keeps serving and the root's error shows in the listing and on
    /metrics; once it is back, the next change is picked up."""
    from tests.s3_server import delete, upload

    server, bucket = object_store
    client, prefix = server.client(), QWEN_VL_S3_ROOT.removeprefix(f"s3://{bucket}/")
    name = f"{PREFIX}_s3"
    v1 = qwen_adapters(qwen2_base, tmp_path / "v1", [name], seed=41) / name
    v2 = qwen_adapters(qwen2_base, tmp_path / "v2", [name], seed=42) / name
    too_wide = qwen_adapters(qwen2_base, tmp_path / "wide", [name], seed=43, rank=32) / name
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_bytes((v1 / "adapter_config.json").read_bytes())
    (pickled / "adapter_model.bin").write_bytes(b"a pickle, never loaded")
    escape = f"{prefix}{name}_escape/../../above/adapter_model.safetensors"
    try:
        upload(client, bucket, prefix, v1)
        upload(client, bucket, prefix, pickled, name=f"{name}_pickled")
        upload(client, bucket, prefix, too_wide, name=f"{name}_wide")
        client.put_object(Bucket=bucket, Key=escape, Body=b"outside its folder")
        refused = command(grpc_url, "rescan")["refused"]
        assert "adapter_model.bin (pickle) refused" in refused[f"{name}_pickled"], refused
        assert "has a '..'" in refused[f"{name}_escape"], refused
        assert "rank 32 exceeds max_lora_rank 16" in refused[f"{name}_wide"], refused
        item = served(grpc_url)[name]
        assert item["path"] == f"{QWEN_VL_S3_ROOT}{name}/" and item["source"] == "root"
        expected_v1 = reference(qwen2_base, v1)
        assert ask(grpc_url, name).text == expected_v1
        client.delete_object(Bucket=bucket, Key=escape)
        delete(client, bucket, f"{prefix}{name}_pickled/")
        delete(client, bucket, f"{prefix}{name}_wide/")
        long_v1 = Streaming(grpc_url, name).text()  # what one running across the change gives
        assert root_error_since(triton_server.metrics) == 0.0

        server.stop()
        try:
            report = command(grpc_url, "rescan")
            assert f"adapter root {QWEN_VL_S3_ROOT} cannot be read" in report["problems"][0]
            root = command(grpc_url, "list")["roots"][1]
            assert root["path"] == QWEN_VL_S3_ROOT and "cannot be read" in root["error"]
            assert ask(grpc_url, name).text == expected_v1  # serving goes on
            assert time.time() - 600 < root_error_since(triton_server.metrics) <= time.time()
        finally:
            server.start()  # back, empty (moto keeps nothing): the bucket is written again
            client.create_bucket(Bucket=bucket)
        running = Streaming(grpc_url, name)  # on version 1 while the bucket gets version 2
        upload(client, bucket, prefix, v2)  # new ETags: a new version
        command(grpc_url, "rescan")
        assert served(grpc_url)[name]["version"] == 2
        assert running.text() == long_v1
        assert "error" not in command(grpc_url, "list")["roots"][1]
        expected_v2 = reference(qwen2_base, v2)
        assert expected_v2 != expected_v1  # the two versions answer differently
        assert ask(grpc_url, name).text == expected_v2
        assert root_error_since(triton_server.metrics) == 0.0
    finally:
        delete(client, bucket, f"{prefix}{name}/")
    command(grpc_url, "rescan")
    assert name not in served(grpc_url)
    assert f"unknown adapter '{name}'" in ask(grpc_url, name).error


def root_error_since(metrics_port: int) -> float:
    """lora_adapter_root_error_since_seconds of the bucket root (one stub serves the model)."""
    from tests.e2e.test_adapter_metrics import scrape

    values = [
        value
        for (metric, labels), value in scrape(metrics_port).items()
        if metric == "lora_adapter_root_error_since_seconds"
        and ("root", QWEN_VL_S3_ROOT) in labels
        and ("model", MODEL) in labels
    ]
    assert len(values) == 1, values
    return values[0]


# ---- many adapters -------------------------------------------------------------------------------
def test_32_adapters_concurrently_each_equal_its_reference(grpc_url, qwen2_base, tmp_path):
    names = [f"{PREFIX}{index:02d}" for index in range(32)]
    folders = qwen_adapters(qwen2_base, tmp_path, names, seed=32)
    for name in names:
        publish(folders / name, name)
    report = command(grpc_url, "rescan")
    assert report["refused"] == {}, report["refused"]
    assert set(names) <= set(served(grpc_url))

    # Every 4th request carries the image (vision tower and merger LoRA); the others are text
    # only, whose references are cheaper to compute.
    with_image = {name: index % 4 == 0 for index, name in enumerate(names)}
    image_fields = qwen_inputs(sampling_parameters=sampling(max_tokens=FLEET_TOKENS))
    text_fields = {key: value for key, value in image_fields.items() if key != "image"}
    requests = [(image_fields if with_image[n] else text_fields, {"lora_name": n}) for n in names]
    outcomes = grpc_many(grpc_url, MODEL, requests)
    texts = {name: outcome.text for name, outcome in zip(names, outcomes, strict=True)}
    for name in names:
        expected = reference(qwen2_base, folders / name, FLEET_TOKENS, image=with_image[name])
        assert texts[name] == expected, name
    assert len(set(texts.values())) > 24, "the adapters should mostly answer differently"

    states = [item["state"] for item in served(grpc_url).values()]
    assert states.count("loaded") <= 4  # max_loras
    assert states.count("loaded") + states.count("cached") <= 8  # max_cpu_loras
    for name in names:
        retract(name)
    command(grpc_url, "rescan")
    assert not set(names) & set(served(grpc_url))


# ---- refusals ------------------------------------------------------------------------------------
def bad_adapters(demo_models: Path, tmp_path: Path) -> dict[str, str]:
    """Publish one refused folder per case; name -> the message its refusal carries."""
    qwen2 = demo_models / "qwen2-vl-tiny"
    qwen2_5 = demo_models / "qwen2_5-vl-tiny"
    built = tmp_path / "built"
    qwen_adapters(qwen2, built, [f"{PREFIX}_rank32"], seed=1, rank=32)
    qwen_adapters(qwen2_5, built, [f"{PREFIX}_qwen2_5"], seed=1)
    bad_name = f"bad name {PREFIX}"
    qwen_adapters(qwen2, built, [f"{PREFIX}_pickle", f"{PREFIX}_no_weights", bad_name], seed=1)
    shapes = built / f"{PREFIX}_shapes"  # Qwen2.5's weights, claiming Qwen2 as their base
    shutil.copytree(built / f"{PREFIX}_qwen2_5", shapes)
    config = json.loads((shapes / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(qwen2)
    (shapes / "adapter_config.json").write_text(json.dumps(config))
    (built / f"{PREFIX}_pickle" / "adapter_model.safetensors").rename(
        built / f"{PREFIX}_pickle" / "adapter_model.bin"
    )
    (built / f"{PREFIX}_no_weights" / "adapter_model.safetensors").unlink()
    for folder in built.iterdir():
        publish(folder, folder.name)
    os.symlink(demo_models / "qwen2-vl-adapters" / "alpha", ROOT / f"{PREFIX}_escape")
    return {
        f"{PREFIX}_rank32": "rank 32 exceeds max_lora_rank 16 (model.json)",
        f"{PREFIX}_qwen2_5": "trained for base model",
        f"{PREFIX}_shapes": "module(s) do not exist in base model 'qwen2-vl-tiny'",
        f"{PREFIX}_pickle": "adapter_model.bin (pickle) refused",
        f"{PREFIX}_no_weights": "adapter_model.safetensors is missing",
        f"{PREFIX}_escape": "outside the adapter root",
        bad_name: f"invalid adapter name {bad_name}",
    }


def test_each_refused_adapter_has_its_message_and_the_rest_serve(
    grpc_url, demo_models, qwen2_base, tmp_path
):
    expected = bad_adapters(demo_models, tmp_path)
    good = f"{PREFIX}_good"
    good_folder = qwen_adapters(qwen2_base, tmp_path / "good", [good], seed=7) / good
    publish(good_folder, good)
    report = command(grpc_url, "rescan")
    refused = command(grpc_url, "list")["refused"]
    for name, message in expected.items():
        assert message in report["refused"].get(name, ""), (name, report["refused"].get(name))
        assert message in refused.get(name, ""), name
    assert good in served(grpc_url)

    names = ["alpha", good, f"{PREFIX}_rank32", None]
    outcomes = grpc_many(
        grpc_url, MODEL, [(qwen_inputs(), {"lora_name": n} if n else None) for n in names]
    )
    alpha, fresh, refused_one, base = outcomes
    assert alpha.text == reference(qwen2_base, demo_models / "qwen2-vl-adapters" / "alpha")
    assert fresh.text == reference(qwen2_base, good_folder)
    assert base.text == reference(qwen2_base, None)
    assert f"unknown adapter '{PREFIX}_rank32'" in refused_one.error

    with pytest.raises(RequestError, match="outside the adapter roots"):
        command(grpc_url, f"load {PREFIX}_x {demo_models / 'qwen2-vl-adapters' / 'alpha'}")
    with pytest.raises(RequestError, match="rank 32 exceeds max_lora_rank 16"):
        command(grpc_url, f"load {PREFIX}_x {PREFIX}_rank32")
    with pytest.raises(RequestError, match="invalid adapter name"):
        command(grpc_url, f"load ../x {good}")
    mixed = grpc_one(grpc_url, MODEL, {"adapter_command": "list", "text_input": "hi"})
    assert "an adapter_command request carries no other inputs" in mixed.error
    clear_root()
    command(grpc_url, "rescan")
    assert not [name for name in command(grpc_url, "list")["refused"] if PREFIX in name]


# ---- control requests on the repository's own adapters -------------------------------------------
def test_unload_and_load_back_a_multi_lora_adapter(grpc_url, demo_models, qwen2_base, tmp_path):
    beta = demo_models / "qwen2-vl-adapters" / "beta"
    assert command(grpc_url, "unload beta") == {"model": MODEL, "unloaded": "beta", "in_flight": 0}
    assert "unknown adapter 'beta'" in ask(grpc_url, "beta").error
    report = command(grpc_url, "rescan")
    assert "beta" in report["held"] and "beta" not in served(grpc_url)
    assert command(grpc_url, "list")["unloaded"] == ["beta"]

    answer = command(grpc_url, "load beta")
    assert answer["loaded"] == "beta" and answer["version"] == 2
    assert served(grpc_url)["beta"]["source"] == "multi_lora.json"
    assert ask(grpc_url, "beta").text == reference(qwen2_base, beta)

    # A folder inside the root, loaded under a name of the operator's choosing.
    name = f"{PREFIX}_chosen"
    folder = qwen_adapters(qwen2_base, tmp_path, [f"{PREFIX}_src"], seed=9) / f"{PREFIX}_src"
    publish(folder, f".{PREFIX}_hidden")  # a dot-folder: no rescan serves it by itself
    answer = command(grpc_url, f"load {name} .{PREFIX}_hidden")
    assert answer["loaded"] == name and served(grpc_url)[name]["source"] == "control"
    assert ask(grpc_url, name).text == reference(qwen2_base, folder)
    assert command(grpc_url, f"unload {name}")["unloaded"] == name
    assert command(grpc_url, "list")["unloaded"] == []  # its name is free again
    shutil.rmtree(ROOT / f".{PREFIX}_hidden")
