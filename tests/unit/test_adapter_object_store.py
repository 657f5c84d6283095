"""Adapter roots in object storage (s3://bucket/prefix/) against a real S3-API server: moto's
standalone server in its own environment (tests/s3_server.py), reached by the fleet's own boto3
client through the standard AWS variables; never a mocked client. The engine is the fake of
test_adapter_fleet.py (only our bookkeeping is under test); tests/e2e/test_adapter_fleet.py
serves a bucket's adapter through the real engine and Triton."""

import asyncio
import time
from functools import partial
from pathlib import Path

import pytest

from lora_serving.adapters import object_store
from lora_serving.adapters.catalog import load_adapter
from lora_serving.adapters.checks import BaseModel
from lora_serving.adapters.fleet import AdapterFleet
from lora_serving.adapters.object_store import S3Root
from lora_serving.adapters.snapshots import Snapshots
from lora_serving.adapters.sources import AdapterSources, SourceUnavailable
from lora_serving.errors import ConfigError, InvalidRequest, UnknownAdapter
from lora_serving.metrics import AdapterRootErrors
from lora_serving.settings import AdapterOptions, adapter_root
from tests.s3_server import S3Server, delete, upload
from tests.unit.adapter_factory import make_adapter, make_base
from tests.unit.test_adapter_fleet import FakeEngine, Recorder, run

PREFIX = "tenants/whisper/"
WEIGHTS = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3") / "moto.log").start()
    yield server
    server.stop()


@pytest.fixture
def bucket(s3, monkeypatch, request):
    """A fresh bucket; the fleet's client finds the server through the AWS variables."""
    for variable, value in s3.environment().items():
        monkeypatch.setenv(variable, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    name = f"lora-{request.node.name.replace('_', '-')[:40].strip('-')}-{int(time.time())}"
    s3.client().create_bucket(Bucket=name)
    return name


@pytest.fixture
def world(tmp_path):
    return make_base(tmp_path / "base"), tmp_path / "staging"


def staged(world, name, **kwargs) -> Path:
    base, staging = world
    return make_adapter(staging / name, base=base, **kwargs)


def new_fleet(tmp_path, world, bucket, *, metrics=None, logs=None, **limits) -> AdapterFleet:
    base, _ = world
    logs = [] if logs is None else logs
    return AdapterFleet(
        sources=AdapterSources(None, (f"s3://{bucket}/{PREFIX}",), **limits),
        snapshots=Snapshots(tmp_path / "snapshots", "s3"),
        validate=partial(load_adapter, max_lora_rank=8, base_model=BaseModel.from_folder(base)),
        log=logs.append,
        warn=logs.append,
        metrics=metrics,
    )


# ---- listing, versions, deletion ---------------------------------------------------------------
def test_each_subfolder_of_the_prefix_is_an_adapter_served_from_its_snapshot(
    tmp_path, world, bucket, s3
):
    client = s3.client()
    for name in ("b", "a"):
        upload(client, bucket, PREFIX, staged(world, name))
    client.put_object(Bucket=bucket, Key=f"{PREFIX}README.md", Body=b"beside the adapters")
    client.put_object(Bucket=bucket, Key=f"{PREFIX}a/notes/train.log", Body=b"not read")
    upload(client, bucket, PREFIX, staged(world, "hidden"), name=".staging")
    client.put_object(Bucket=bucket, Key=f"other/c/{WEIGHTS}", Body=b"another prefix")
    engine = FakeEngine()
    logs = []
    fleet = new_fleet(tmp_path, world, bucket, logs=logs)

    async def scenario():
        refused = (await fleet.describe())["refused"]
        assert sorted(fleet.names) == ["a", "b"], (refused, logs, s3.log_path.read_text()[-3000:])
        adapter = fleet.resolve("a")
        assert adapter.source == "root" and adapter.origin == f"s3://{bucket}/{PREFIX}a/"
        assert adapter.path.parent.parent == tmp_path / "snapshots"
        assert sorted(p.name for p in adapter.path.iterdir()) == [
            "adapter_config.json",
            WEIGHTS,
        ]
        assert (adapter.path / WEIGHTS).read_bytes() == (world[1] / "a" / WEIGHTS).read_bytes()
        listing = await fleet.describe()
        assert listing["roots"] == [{"path": f"s3://{bucket}/{PREFIX}", "exists": True}]
        assert listing["adapters"][0]["path"] == f"s3://{bucket}/{PREFIX}a/"
        assert listing["refused"] == {}
        fetched = [line for line in s3.requests_for(f"{PREFIX}a/") if '"GET' in line]
        assert len(fetched) == 2 and not [line for line in fetched if "notes" in line]

    run(fleet, engine, scenario)
    assert not list((tmp_path / "snapshots").glob("*/*"))  # close() removes every snapshot


def test_a_changed_etag_is_a_new_version_and_a_deleted_adapter_is_removed(
    tmp_path, world, bucket, s3
):
    client = s3.client()
    upload(client, bucket, PREFIX, staged(world, "a"))
    engine = FakeEngine()
    fleet = new_fleet(tmp_path, world, bucket)

    async def scenario():
        first = fleet.resolve("a")
        report = await fleet.rescan()
        assert not report.changed and report.problems == []  # same ETags: nothing to do
        upload(client, bucket, PREFIX, staged(world, "a2", seed=7), name="a")
        report = await fleet.rescan()
        second = fleet.resolve("a")
        assert report.replaced == ["a"] and second.version == 2
        new_weights = (world[1] / "a2" / WEIGHTS).read_bytes()
        assert (second.path / WEIGHTS).read_bytes() == new_weights
        assert engine.removed == [first.int_id] and not first.path.exists()

        upload(client, bucket, PREFIX, staged(world, "b"))
        delete(client, bucket, f"{PREFIX}a/")
        report = await fleet.rescan()
        assert report.removed == ["a"] and report.added == ["b"]
        with pytest.raises(UnknownAdapter):
            fleet.resolve("a")

    run(fleet, engine, scenario)


# ---- refusals ----------------------------------------------------------------------------------
def test_each_refused_adapter_has_its_reason_and_the_rest_serve(tmp_path, world, bucket, s3):
    client = s3.client()
    upload(client, bucket, PREFIX, staged(world, "good"))
    upload(client, bucket, PREFIX, staged(world, "pickled", weights="bin"))
    upload(client, bucket, PREFIX, staged(world, "rank_too_high", rank=16))
    upload(client, bucket, PREFIX, staged(world, "no_weights", weights="none"))
    upload(client, bucket, PREFIX, staged(world, "escape"))
    client.put_object(Bucket=bucket, Key=f"{PREFIX}escape/../../x/{WEIGHTS}", Body=b"up")
    client.put_object(Bucket=bucket, Key=f"{PREFIX}../above/{WEIGHTS}", Body=b"up")
    client.put_object(Bucket=bucket, Key=f"{PREFIX}/absolute/{WEIGHTS}", Body=b"root")
    upload(client, bucket, PREFIX, staged(world, "bad name"))
    many = staged(world, "many")
    for index in range(4):
        client.put_object(Bucket=bucket, Key=f"{PREFIX}many/extra/{index}.txt", Body=b"x")
    upload(client, bucket, PREFIX, many)
    big = staged(world, "big", modules={"model.layers.0.mlp.fc1": (4096, 64)})
    upload(client, bucket, PREFIX, big)
    expected = {
        "pickled": "adapter_model.bin (pickle) refused",
        "rank_too_high": "rank 16 exceeds max_lora_rank 8",
        "no_weights": "adapter_model.safetensors is missing",
        "escape": "has a '..', '.' or empty path component",
        "..": f"key '{PREFIX}../above/{WEIGHTS}' has a '..'",
        f"'{PREFIX}/absolute/{WEIGHTS}'": "empty path component",
        "bad name": "invalid adapter name bad name",
        "many": "6 objects, over max_adapter_objects 5",
        "big": "bytes to download, over max_adapter_bytes 50000",
    }
    engine = FakeEngine()
    fleet = new_fleet(tmp_path, world, bucket, max_adapter_objects=5, max_adapter_bytes=50_000)

    async def scenario():
        report = await fleet.rescan()
        for name, message in expected.items():
            assert message in report.refused.get(name, ""), (name, report.refused)
        assert fleet.names == ["good"] and report.problems == []
        assert set((await fleet.describe())["refused"]) == set(expected)
        assert len(engine.loaded) == 1

    run(fleet, engine, scenario)
    for key in ("pickled/adapter_model.bin", f"big/{WEIGHTS}", "escape/", f"../above/{WEIGHTS}"):
        fetched = [line for line in s3.requests_for(PREFIX + key) if '"GET' in line]
        assert fetched == [], key  # refused before anything was downloaded
    assert not list((tmp_path / "snapshots").glob("*/*"))


def test_an_object_changed_after_the_listing_is_not_downloaded(tmp_path, world, bucket, s3):
    """Each object is fetched with If-Match on its listed ETag: a snapshot is exactly what was
    listed, or nothing (tried again at the next rescan)."""
    client = s3.client()
    upload(client, bucket, PREFIX, staged(world, "a"))
    root = S3Root(f"s3://{bucket}/{PREFIX}", max_adapter_bytes=1 << 30, max_objects=8)
    candidate = root.scan().candidates["a"]
    upload(client, bucket, PREFIX, staged(world, "a2", seed=3), name="a")
    target = tmp_path / "partial"
    target.mkdir()
    with pytest.raises(SourceUnavailable, match="changed since it was listed"):
        root.materialise(candidate, target)
    fresh = root.scan().candidates["a"]
    assert fresh.fingerprint != candidate.fingerprint
    root.materialise(fresh, tmp_path)
    assert (tmp_path / WEIGHTS).read_bytes() == (world[1] / "a2" / WEIGHTS).read_bytes()


# ---- the store away ---------------------------------------------------------------------------
def test_store_stopped_mid_run_keeps_serving_shows_the_error_and_recovers(
    tmp_path, world, bucket, s3
):
    client = s3.client()
    upload(client, bucket, PREFIX, staged(world, "a"))
    metrics, logs = Recorder(), []
    fleet = new_fleet(tmp_path, world, bucket, metrics=metrics, logs=logs)
    url = f"s3://{bucket}/{PREFIX}"

    async def scenario():
        adapter = fleet.resolve("a")
        assert metrics.events[0] == AdapterRootErrors({url: 0.0})
        s3.stop()
        try:
            started = time.monotonic()
            report = await fleet.rescan()
            assert time.monotonic() - started < 15
            assert report.removed == [] and fleet.names == ["a"]
            assert f"adapter root {url} cannot be read" in report.problems[0]
            with fleet.lease(adapter) as running:  # serving goes on
                assert running == adapter
            root = (await fleet.describe())["roots"][0]
            assert root["exists"] is False and "cannot be read" in root["error"]
            since = [e for e in metrics.events if isinstance(e, AdapterRootErrors)][-1].since
            assert time.time() - 60 < since[url] <= time.time()
            assert root["error_since"] == time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(since[url])
            )
            await fleet.rescan()  # still down: the same error, since the same time
            assert (await fleet.describe())["roots"][0]["error_since"] == root["error_since"]
            assert sum("cannot be read" in line for line in logs) == 1  # warned once
        finally:
            s3.start()  # the store comes back (moto keeps nothing: the bucket is restored)
        client.create_bucket(Bucket=bucket)
        upload(client, bucket, PREFIX, world[1] / "a")  # the same bytes: the same ETags
        upload(client, bucket, PREFIX, staged(world, "b"))
        report = await fleet.rescan()
        assert report.problems == [] and report.added == ["b"] and not report.replaced
        assert fleet.resolve("a") == adapter  # version 1 served throughout
        assert (await fleet.describe())["roots"][0] == {"path": url, "exists": True}
        root_errors = [e for e in metrics.events if isinstance(e, AdapterRootErrors)]
        assert [event.since[url] > 0 for event in root_errors] == [False, True, False]
        assert any(f"adapter source {url} is readable again" in line for line in logs)

    run(fleet, FakeEngine(), scenario)


def test_a_store_that_never_answers_costs_a_rescan_bounded_time(
    tmp_path, world, bucket, s3, monkeypatch
):
    """A paused server accepts connections and never answers: the client's read timeout and
    its one retry bound the rescan (shortened here), and requests are served meanwhile."""
    monkeypatch.setattr(object_store, "READ_TIMEOUT_S", 0.5)
    upload(s3.client(), bucket, PREFIX, staged(world, "a"))
    fleet = new_fleet(tmp_path, world, bucket)

    async def scenario():
        adapter = fleet.resolve("a")
        s3.pause()
        try:
            rescan = asyncio.ensure_future(fleet.rescan())
            await asyncio.sleep(0.2)
            assert not rescan.done()
            with fleet.lease(fleet.resolve("a")) as running:  # not held up by the rescan
                assert running == adapter
            started = time.monotonic()
            report = await rescan
            assert time.monotonic() - started < 10
            assert "cannot be read" in report.problems[0] and fleet.names == ["a"]
        finally:
            s3.resume()
        assert (await fleet.rescan()).problems == []

    run(fleet, FakeEngine(), scenario)


# ---- control requests and settings -----------------------------------------------------------
def test_load_names_a_prefix_inside_an_s3_root(tmp_path, world, bucket, s3):
    client = s3.client()
    upload(client, bucket, PREFIX, staged(world, "v1"), name=".incoming")
    fleet = new_fleet(tmp_path, world, bucket)
    url = f"s3://{bucket}/{PREFIX}"

    async def scenario():
        assert fleet.names == []  # a dot-name: no rescan serves it by itself
        result = await fleet.load("prod", f"{url}.incoming/")
        assert result["loaded"] == "prod" and fleet.resolve("prod").source == "control"
        assert (await fleet.load("prod2", ".incoming"))["loaded"] == "prod2"  # relative
        with pytest.raises(InvalidRequest, match="outside the adapter roots"):
            await fleet.load("x", f"s3://{bucket}/elsewhere/a/")
        with pytest.raises(InvalidRequest, match="does not exist"):
            await fleet.load("x", f"{url}nothing/")
        with pytest.raises(InvalidRequest, match="name one folder directly under"):
            await fleet.load("x", f"{url}a/../b/")

    run(fleet, FakeEngine(), scenario)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("s3://bucket", "s3://bucket/"),
        ("s3://bucket/a/b", "s3://bucket/a/b/"),
        ("s3://bucket/a//b/", "expected s3://bucket/ or s3://bucket/prefix/"),
        ("s3://bucket/../a/", "expected s3://bucket/ or s3://bucket/prefix/"),
        ("s3:///a/", "expected s3://bucket/ or s3://bucket/prefix/"),
        ("gs://bucket/a/", "only folders and s3://bucket/prefix/ URLs are supported"),
    ],
)
def test_root_urls(value, expected):
    assert expected in str(adapter_root(value, Path("/models/m/1")))


def test_roots_env_adds_roots_when_the_model_loads(tmp_path):
    raw = {"roots": ["../adapters", "s3://shared/all/"], "roots_env": "EXTRA_ROOTS"}
    options, problems = AdapterOptions.from_dict(raw, model_dir=tmp_path)
    assert problems == []
    environ = {"EXTRA_ROOTS": "s3://tenant-a/adapters , /srv/more,s3://shared/all/"}
    assert options.all_roots(model_dir=tmp_path, environ=environ) == (
        (tmp_path / "../adapters").resolve(),
        "s3://shared/all/",
        "s3://tenant-a/adapters/",
        Path("/srv/more"),
    )
    assert options.all_roots(model_dir=tmp_path, environ={}) == options.roots
    with pytest.raises(ConfigError, match="EXTRA_ROOTS: 'gs://x/'"):
        options.all_roots(model_dir=tmp_path, environ={"EXTRA_ROOTS": "gs://x/"})
    _, problems = AdapterOptions.from_dict(
        {"roots": ["s3://b/../x"], "max_adapter_bytes": 0, "roots_env": "1X"}, model_dir=tmp_path
    )
    assert len(problems) == 3, problems


def test_a_name_in_a_folder_root_and_a_bucket_is_served_from_the_first_root(
    tmp_path, world, bucket, s3
):
    base, _ = world
    folder_root = tmp_path / "root"
    make_adapter(folder_root / "shared", base=base)
    upload(s3.client(), bucket, PREFIX, staged(world, "shared", seed=4))
    url = f"s3://{bucket}/{PREFIX}"
    fleet = AdapterFleet(
        sources=AdapterSources(None, (folder_root, url)),
        snapshots=Snapshots(tmp_path / "snapshots", "s3"),
        validate=partial(load_adapter, max_lora_rank=8, base_model=BaseModel.from_folder(base)),
        log=lambda line: None,
    )

    async def scenario():
        assert fleet.resolve("shared").origin == (folder_root / "shared").resolve()
        report = await fleet.rescan()
        assert (
            f"adapter 'shared' in root {url} is also provided by root {folder_root}"
            in (report.refused["shared"])
        )

    run(fleet, FakeEngine(), scenario)
