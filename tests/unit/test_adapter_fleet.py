"""AdapterFleet with a fake engine: sources, runtime add / replace / remove, leases, refusals,
control commands, listing. Only our own bookkeeping and ordering are under test here; the real
engine and Triton are in tests/e2e/test_adapter_fleet.py."""

import asyncio
import json
import os
from functools import partial

import pytest

from lora_serving.adapters.catalog import load_adapter
from lora_serving.adapters.checks import BaseModel
from lora_serving.adapters.fleet import AdapterFleet
from lora_serving.adapters.sources import AdapterSources, Snapshots
from lora_serving.errors import AdapterUnavailable, ConfigError, InvalidRequest, UnknownAdapter
from lora_serving.metrics import AdapterStates
from tests.unit.adapter_factory import make_adapter, make_base, publish


class FakeEngine:
    """Records what the fleet loads; `refuse` names adapters whose add_lora fails."""

    def __init__(self, refuse=()):
        self.loaded = {}  # int_id -> Adapter
        self.removed = []
        self.refuse = set(refuse)

    async def add_lora(self, adapter):
        assert (adapter.path / "adapter_model.safetensors").is_file()  # reads its snapshot
        if adapter.name in self.refuse:
            raise RuntimeError("Call to add_lora method failed: unsupported LoRA feature")
        self.loaded[adapter.int_id] = adapter

    async def remove_lora(self, int_id):
        self.removed.append(int_id)
        self.loaded.pop(int_id, None)

    async def lora_state(self):
        ids = sorted(self.loaded)
        return set(ids[:1]), set(ids[:2])  # first in a slot, first two cached


class Recorder:
    def __init__(self):
        self.events = []

    def record(self, event):
        self.events.append(event)


@pytest.fixture
def world(tmp_path):
    """(base model folder, adapter root, staging folder, logs)."""
    return make_base(tmp_path / "base"), tmp_path / "root", tmp_path / "staging", []


def new_fleet(tmp_path, world, *, multi_lora=None, module_check=None, max_lora_rank=8, **kw):
    base, root, _, logs = world
    validate = partial(
        load_adapter,
        max_lora_rank=max_lora_rank,
        module_check=module_check,
        base_model=BaseModel.from_folder(base),
    )
    return AdapterFleet(
        sources=AdapterSources(multi_lora, (root,)),
        snapshots=Snapshots(tmp_path / "snapshots", "test"),
        validate=validate,
        limits={"max_loras": 4, "max_cpu_loras": 8, "max_lora_rank": max_lora_rank},
        log=logs.append,
        warn=logs.append,
        **kw,
    )


def run(fleet, engine, scenario):
    async def main():
        fleet.prepare()
        await fleet.start(engine)
        try:
            return await scenario()
        finally:
            await fleet.stop()
            fleet.close()

    return asyncio.run(main())


def staged(world, name, **kwargs):
    """An adapter built in the staging folder, ready to publish into the root."""
    base, _, staging, _ = world
    return make_adapter(staging / name, base=base, **kwargs)


def snapshot_dirs(tmp_path):
    return sorted(path.name for path in (tmp_path / "snapshots").glob("*/*"))


# ---- sources at start ------------------------------------------------------------------------
def test_root_folders_are_adapters_named_after_them(tmp_path, world):
    _, root, _, _ = world
    for name in ("b", "a"):
        publish(staged(world, name), root, name)
    (root / ".c.tmp").mkdir()  # being written: skipped
    (root / "notes.txt").write_text("not an adapter")
    engine = FakeEngine()
    fleet = new_fleet(tmp_path, world)

    async def scenario():
        assert sorted(fleet.names) == ["a", "b"]
        assert [a.int_id for a in sorted(fleet, key=lambda a: a.name)] == [1, 2]
        adapter = fleet.resolve("a")
        assert adapter.source == "root" and adapter.origin == (root / "a").resolve()
        assert adapter.path.parent.parent == tmp_path / "snapshots"  # served from a snapshot
        assert adapter.to_lora_request().lora_name == "a@1"
        assert set(engine.loaded) == {1, 2}

    run(fleet, engine, scenario)
    assert snapshot_dirs(tmp_path) == []  # close() removes every snapshot


def test_multi_lora_json_first_with_ids_in_file_order(tmp_path, world):
    base, root, staging, _ = world
    make_adapter(staging / "y", base=base)
    make_adapter(staging / "x", base=base)
    publish(staged(world, "z"), root, "z")
    publish(staged(world, "x2"), root, "x")  # same name as multi_lora.json's: refused
    multi = tmp_path / "multi_lora.json"
    multi.write_text(json.dumps({"y": "staging/y", "x": "staging/x"}))
    fleet = new_fleet(tmp_path, world, multi_lora=multi)

    async def scenario():
        assert {a.name: a.int_id for a in fleet} == {"y": 1, "x": 2, "z": 3}
        assert fleet.resolve("x").source == "multi_lora.json"
        listing = await fleet.describe()
        assert listing["refused"] == {}  # the duplicate is reported in logs and rescans
        report = await fleet.rescan()
        assert "also provided by multi_lora.json" in report.refused["x"]

    run(fleet, FakeEngine(), scenario)


def test_bad_multi_lora_entry_fails_the_load_bad_root_folder_does_not(tmp_path, world):
    base, root, staging, logs = world
    make_adapter(staging / "big", base=base, rank=16)
    publish(staged(world, "also_big", rank=16), root, "also_big")
    multi = tmp_path / "multi_lora.json"
    multi.write_text(json.dumps({"big": "staging/big", "gone": "staging/missing"}))
    with pytest.raises(ConfigError) as err:
        new_fleet(tmp_path, world, multi_lora=multi).prepare()
    assert "rank 16 exceeds max_lora_rank 8" in str(err.value)
    assert "missing does not exist" in str(err.value)
    assert snapshot_dirs(tmp_path) == []

    multi.write_text(json.dumps({}))
    fleet = new_fleet(tmp_path, world, multi_lora=multi)

    async def scenario():
        assert fleet.names == []
        listing = await fleet.describe()
        assert "rank 16 exceeds max_lora_rank 8" in listing["refused"]["also_big"]

    run(fleet, FakeEngine(), scenario)
    assert any("also_big" in line for line in logs)


# ---- runtime changes ---------------------------------------------------------------------------
def test_add_replace_remove_by_rescan(tmp_path, world):
    _, root, _, logs = world
    engine = FakeEngine()
    fleet = new_fleet(tmp_path, world)

    async def scenario():
        with pytest.raises(UnknownAdapter, match="unknown adapter 'fresh'; available: none"):
            fleet.resolve("fresh")
        publish(staged(world, "fresh"), root, "fresh")
        report = await fleet.rescan()
        assert report.added == ["fresh"]
        first = fleet.resolve("fresh")
        assert (first.int_id, first.version) == (1, 1)
        assert (await fleet.rescan()).as_dict()["added"] == []  # unchanged: nothing to do

        replacement = staged(world, "fresh_v2", seed=1)
        os.replace(
            replacement / "adapter_model.safetensors", root / "fresh" / "adapter_model.safetensors"
        )
        report = await fleet.rescan()
        second = fleet.resolve("fresh")
        assert report.replaced == ["fresh"] and (second.int_id, second.version) == (2, 2)
        assert engine.removed == [1] and not first.path.exists()  # nothing ran on version 1

        (root / "fresh").rename(root / ".fresh.old")
        report = await fleet.rescan()
        assert report.removed == ["fresh"] and engine.removed == [1, 2]
        with pytest.raises(UnknownAdapter):
            fleet.resolve("fresh")

    run(fleet, engine, scenario)
    assert any("added ['fresh']" in line for line in logs)


def test_a_tampered_snapshot_refuses_only_its_own_requests(tmp_path, world):
    """The engine may re-read a snapshot at any time: changed or deleted files must give a
    per-request error, never weights the checks did not see."""
    _, root, _, logs = world
    for name in ("a", "b"):
        publish(staged(world, name), root, name)
    fleet = new_fleet(tmp_path, world)

    async def scenario():
        a, b = fleet.resolve("a"), fleet.resolve("b")
        weights = a.path / "adapter_model.safetensors"
        assert not os.access(weights, os.W_OK) or os.geteuid() == 0  # read-only copies
        weights.chmod(0o644)
        weights.write_bytes(b"garbage")
        for _ in range(2):
            with pytest.raises(AdapterUnavailable, match="'a' cannot be served: its checked"):
                with fleet.lease(a):
                    pass
        assert sum("'a' cannot be served" in line for line in logs) == 1  # warned once
        with fleet.lease(b) as running:
            assert running == b
        (b.path / "adapter_model.safetensors").unlink()
        with pytest.raises(AdapterUnavailable, match="'b' cannot be served"):
            with fleet.lease(b):
                pass
        await fleet.load("a")  # taken again from its (intact) folder
        with fleet.lease(fleet.resolve("a")) as running:
            assert running.int_id != a.int_id

    run(fleet, FakeEngine(), scenario)


def test_in_flight_request_keeps_its_version_until_it_ends(tmp_path, world):
    _, root, _, _ = world
    publish(staged(world, "a"), root, "a")
    engine = FakeEngine()
    fleet = new_fleet(tmp_path, world)

    async def scenario():
        old = fleet.resolve("a")
        with fleet.lease(old) as running:
            assert running == old
            os.replace(
                staged(world, "a2", seed=5) / "adapter_model.safetensors",
                root / "a" / "adapter_model.safetensors",
            )
            await fleet.rescan()
            new = fleet.resolve("a")
            assert new.int_id != old.int_id
            listing = await fleet.describe()
            assert [(v["id"], v["in_flight"]) for v in listing["retiring"]] == [(old.int_id, 1)]
            assert old.int_id in engine.loaded and old.path.exists()  # still running on it
            with fleet.lease(old) as late:  # decoded before the replacement, started after
                assert late == new
        await asyncio.sleep(0.05)  # the drop runs as a task on the loop
        assert old.int_id not in engine.loaded and not old.path.exists()
        assert (await fleet.describe())["retiring"] == []

        with fleet.lease(new):
            result = await fleet.unload("a")
            assert result == {"unloaded": "a", "in_flight": 1}
            with pytest.raises(UnknownAdapter):
                fleet.resolve("a")
            with pytest.raises(UnknownAdapter):
                with fleet.lease(new):
                    pass
            assert new.int_id in engine.loaded
        await asyncio.sleep(0.05)
        assert new.int_id not in engine.loaded

    run(fleet, engine, scenario)


def test_ids_are_never_reused(tmp_path, world):
    _, root, _, _ = world
    publish(staged(world, "a"), root, "a")
    fleet = new_fleet(tmp_path, world)

    async def scenario():
        seen = [fleet.resolve("a").int_id]
        for _ in range(3):
            await fleet.unload("a")
            await fleet.load("a")
            seen.append(fleet.resolve("a").int_id)
        assert seen == sorted(set(seen))
        assert fleet.resolve("a").version == 4

    run(fleet, FakeEngine(), scenario)


# ---- refusals --------------------------------------------------------------------------------
def make_refused_folders(world, tmp_path):
    """name -> the message its refusal must contain."""
    base, root, staging, _ = world
    root.mkdir(parents=True, exist_ok=True)
    publish(staged(world, "rank_too_high", rank=16), root, "rank_too_high")
    publish(staged(world, "pickled", weights="bin"), root, "pickled")
    publish(staged(world, "no_weights", weights="none"), root, "no_weights")
    other = make_base(tmp_path / "other-model")
    publish(make_adapter(staging / "other", base=other), root, "wrong_base")
    publish(
        staged(world, "wrong_shapes", modules={"model.layers.0.mlp.fc1": (8, 6)}),
        root,
        "wrong_shapes",
    )
    publish(
        staged(world, "wrong_modules", modules={"model.decoder.layers.0.fc1": (8, 4)}),
        root,
        "wrong_modules",
    )
    outside = make_adapter(tmp_path / "outside", base=base)
    os.symlink(outside, root / "escapes")
    linked = staged(world, "linked_file")
    (linked / "adapter_model.safetensors").unlink()
    os.symlink(outside / "adapter_model.safetensors", linked / "adapter_model.safetensors")
    publish(linked, root, "linked_file")
    publish(staged(world, "bad name"), root, "bad name")
    return {
        "rank_too_high": "rank 16 exceeds max_lora_rank 8",
        "pickled": "adapter_model.bin (pickle) refused",
        "no_weights": "adapter_model.safetensors is missing",
        "wrong_base": "trained for base model",
        "wrong_shapes": "module(s) do not fit base model 'base'",
        "wrong_modules": "module(s) do not exist in base model 'base'",
        "escapes": "outside the adapter root",
        "linked_file": "adapter_model.safetensors links outside the adapter root",
        "bad name": "invalid adapter name bad name",
    }


def test_each_refused_adapter_has_its_message_and_the_rest_serve(tmp_path, world):
    _, root, _, _ = world
    publish(staged(world, "good"), root, "good")
    fleet = new_fleet(tmp_path, world)
    engine = FakeEngine()

    async def scenario():
        expected = make_refused_folders(world, tmp_path)
        report = await fleet.rescan()
        for name, message in expected.items():
            assert message in report.refused.get(name, ""), (name, report.refused.get(name))
        assert fleet.names == ["good"] and report.added == []
        listing = await fleet.describe()
        assert set(listing["refused"]) == set(expected)
        assert len(engine.loaded) == 1
        with pytest.raises(UnknownAdapter):
            fleet.resolve("rank_too_high")

    run(fleet, engine, scenario)
    assert snapshot_dirs(tmp_path) == []


def test_unchanged_refused_folder_is_not_retried_fixed_one_is_added(tmp_path, world):
    _, root, _, _ = world
    publish(staged(world, "later", rank=16), root, "later")
    calls = []
    fleet = new_fleet(tmp_path, world)
    validate = fleet._loader.validate
    fleet._loader.validate = lambda *args, **kw: calls.append(args[0]) or validate(*args, **kw)

    async def scenario():
        await fleet.rescan()
        await fleet.rescan()
        assert calls == ["later"]  # once at start, not again while unchanged
        fixed = staged(world, "later_fixed", rank=8)
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            os.replace(fixed / name, root / "later" / name)
        report = await fleet.rescan()
        assert report.added == ["later"] and fleet.resolve("later").rank == 8
        assert (await fleet.describe())["refused"] == {}

    run(fleet, FakeEngine(), scenario)


def test_refused_replacement_leaves_the_old_version_serving(tmp_path, world):
    _, root, _, _ = world
    publish(staged(world, "a"), root, "a")
    fleet = new_fleet(tmp_path, world)

    async def scenario():
        old = fleet.resolve("a")
        config = json.loads((root / "a" / "adapter_config.json").read_text())
        (root / "a" / "adapter_config.json").write_text(json.dumps({**config, "r": 64}))
        report = await fleet.rescan()
        assert "rank 64 exceeds" in report.refused["a"]
        assert "(version 1 keeps serving)" in report.refused["a"]
        assert fleet.resolve("a") == old

    run(fleet, FakeEngine(), scenario)


def test_adapter_the_engine_refuses_is_refused_and_cleaned_up(tmp_path, world):
    _, root, _, _ = world
    publish(staged(world, "dora"), root, "dora")
    engine = FakeEngine(refuse={"dora"})
    fleet = new_fleet(tmp_path, world)

    async def scenario():
        listing = await fleet.describe()
        assert "the engine refused it: Call to add_lora method failed" in listing["refused"]["dora"]
        assert fleet.names == [] and engine.loaded == {}
        assert snapshot_dirs(tmp_path) == []

    run(fleet, engine, scenario)


def test_module_check_applies_to_runtime_adapters(tmp_path, world):
    _, root, _, _ = world
    fleet = new_fleet(
        tmp_path,
        world,
        module_check=lambda modules: [f"would not apply {len(modules)} module(s)"]
        if any("visual" in m for m in modules)
        else [],
    )

    async def scenario():
        publish(staged(world, "with_vision"), root, "with_vision")
        publish(
            staged(world, "lm_only", modules={"model.layers.0.mlp.fc1": (8, 4)}), root, "lm_only"
        )
        report = await fleet.rescan()
        assert report.added == ["lm_only"]
        assert "would not apply 3 module(s)" in report.refused["with_vision"]

    run(fleet, FakeEngine(), scenario)


def test_unreadable_root_keeps_its_adapters(tmp_path, world):
    _, root, _, _ = world
    publish(staged(world, "a"), root, "a")
    fleet = new_fleet(tmp_path, world)

    async def scenario():
        root.rename(tmp_path / "root_away")  # e.g. a volume briefly unmounted
        report = await fleet.rescan()
        assert report.removed == [] and fleet.names == ["a"]
        assert "cannot be read" in report.problems[0]
        (tmp_path / "root_away").rename(root)
        assert (await fleet.rescan()).problems == []

    run(fleet, FakeEngine(), scenario)


# ---- control commands ------------------------------------------------------------------------
def test_load_from_a_folder_inside_a_root_only(tmp_path, world):
    base, root, _, _ = world
    publish(staged(world, "v1"), root, "v1")
    publish(staged(world, "v2", seed=3), root, "v2")
    outside = make_adapter(tmp_path / "outside", base=base)
    os.symlink(outside, root / "sneaky")
    fleet = new_fleet(tmp_path, world)

    async def scenario():
        result = await fleet.load("prod", "v1")
        assert result == {"loaded": "prod", "version": 1, "id": 3, "replaced": False}
        assert fleet.resolve("prod").source == "control"
        result = await fleet.load("prod", str(root / "v2"))
        assert result["replaced"] and fleet.resolve("prod").origin == (root / "v2").resolve()
        with pytest.raises(InvalidRequest, match="outside the adapter roots"):
            await fleet.load("x", str(outside))
        with pytest.raises(InvalidRequest, match="outside the adapter roots"):
            await fleet.load("x", "sneaky")
        with pytest.raises(InvalidRequest, match="outside the adapter roots"):
            await fleet.load("x", "../outside")
        with pytest.raises(InvalidRequest, match="invalid adapter name"):
            await fleet.load("../x", "v1")
        with pytest.raises(InvalidRequest, match="does not exist"):
            await fleet.load("x", "nothing_here")
        report = await fleet.rescan()  # rescans leave it alone
        assert report.removed == [] and "prod" in fleet.names

    run(fleet, FakeEngine(), scenario)


def test_unload_holds_a_root_adapter_until_load_without_path(tmp_path, world):
    _, root, _, _ = world
    publish(staged(world, "a"), root, "a")
    fleet = new_fleet(tmp_path, world)

    async def scenario():
        await fleet.unload("a")
        report = await fleet.rescan()
        assert report.held == ["a"] and fleet.names == []
        assert (await fleet.describe())["unloaded"] == ["a"]
        with pytest.raises(UnknownAdapter):
            await fleet.unload("a")
        result = await fleet.load("a")
        assert result["version"] == 2 and fleet.resolve("a").source == "root"
        assert (await fleet.rescan()).held == []
        with pytest.raises(InvalidRequest, match="provides an adapter 'nope'"):
            await fleet.load("nope")

    run(fleet, FakeEngine(), scenario)


# ---- listing and metrics -----------------------------------------------------------------------
def test_listing_reports_rank_modules_source_and_engine_state(tmp_path, world):
    _, root, _, _ = world
    for name in ("a", "b", "c"):
        publish(staged(world, name), root, name)
    metrics = Recorder()
    fleet = new_fleet(tmp_path, world, metrics=metrics)

    async def scenario():
        await asyncio.sleep(0.05)  # the state gauges are first reported from a task
        listing = await fleet.describe()
        assert [(a["name"], a["state"]) for a in listing["adapters"]] == [
            ("a", "loaded"),
            ("b", "cached"),
            ("c", "registered"),
        ]
        first = listing["adapters"][0]
        assert first["rank"] == 4 and first["target_modules"] == ["fc1", "fc2", "qkv"]
        assert first["path"] == str((root / "a").resolve()) and first["source"] == "root"
        assert listing["limits"] == {"max_loras": 4, "max_cpu_loras": 8, "max_lora_rank": 8}
        assert listing["roots"] == [{"path": str(root), "exists": True}]
        await fleet.unload("c")
        await asyncio.sleep(0.05)

    run(fleet, FakeEngine(), scenario)
    states = [event.counts for event in metrics.events if isinstance(event, AdapterStates)]
    assert states[0] == {"loaded": 1, "cached": 1, "registered": 1}
    assert states[-1] == {"loaded": 1, "cached": 1, "registered": 0}


def test_engine_host_takes_an_empty_fleet_as_its_leases(tmp_path, world):
    """Regression: a fleet with no adapters yet is falsy (it has a length). EngineHost once
    replaced it by fixed adapters, so no request held a lease, and a replaced version was
    dropped from the engine under a running request: the engine died reloading it."""
    from lora_serving.engine.engine_host import EngineHost
    from lora_serving.settings import EngineSettings

    base, *_ = world
    fleet = new_fleet(tmp_path, world)
    assert len(fleet) == 0
    settings = EngineSettings.from_dict({"model": str(base)}, model_dir=tmp_path)
    assert EngineHost(settings, leases=fleet)._leases is fleet
