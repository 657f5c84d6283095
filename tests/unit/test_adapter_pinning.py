"""Pinned adapters (model.json `serving.adapters.pinned`): which versions the fleet pins in the
engine's adapter cache, within max_cpu_loras - max_loras, across replacement and refusal. The
engine's own pinning is checked on the real engine in tests/engine/test_adapter_pinning.py."""

import asyncio
import os
from pathlib import Path

import pytest

from lora_serving.errors import ConfigError
from lora_serving.settings import EngineSettings
from tests.unit.adapter_factory import make_base, publish
from tests.unit.test_adapter_fleet import FakeEngine, new_fleet, run, staged


@pytest.fixture
def world(tmp_path):
    """As test_adapter_fleet's: (base model folder, adapter root, staging folder, logs)."""
    return make_base(tmp_path / "base"), tmp_path / "root", tmp_path / "staging", []


class PinningEngine(FakeEngine):
    """Pins like vLLM's cache: only an adapter it holds; `refuse_pins` always fails."""

    def __init__(self, refuse_pins=False):
        super().__init__()
        self.pinned = set()
        self.refuse_pins = refuse_pins

    async def pin_lora(self, int_id):
        if self.refuse_pins:
            raise RuntimeError("this vLLM's adapter cache cannot pin")
        assert int_id in self.loaded, "pinned before it was added"
        self.pinned.add(int_id)

    async def remove_lora(self, int_id):
        await super().remove_lora(int_id)
        self.pinned.discard(int_id)  # vLLM unpins what it removes


def test_pinned_names_are_pinned_and_listed(tmp_path, world):
    _, root, _, _ = world
    for name in ("hot", "tail", "other"):
        publish(staged(world, name), root, name)
    engine = PinningEngine()
    fleet = new_fleet(tmp_path, world, pinned=("hot", "not_served"), pin_budget=4)

    async def scenario():
        assert engine.pinned == {fleet.resolve("hot").int_id}
        listing = await fleet.describe()
        assert {a["name"]: a["pinned"] for a in listing["adapters"]} == {
            "hot": True,
            "other": False,
            "tail": False,
        }
        assert listing["pinned"] == ["hot", "not_served"]
        publish(staged(world, "not_served"), root, "not_served")  # appears later: pinned then
        await fleet.rescan()
        assert engine.pinned == {fleet.resolve(n).int_id for n in ("hot", "not_served")}

    run(fleet, engine, scenario)


def test_a_replaced_version_is_pinned_once_the_old_one_leaves(tmp_path, world):
    """Budget 1: while the old version runs a request it keeps the one pin; the new version
    takes it when the old one is dropped."""
    _, root, _, _ = world
    publish(staged(world, "hot"), root, "hot")
    engine = PinningEngine()
    fleet = new_fleet(tmp_path, world, pinned=("hot",), pin_budget=1)

    async def scenario():
        old = fleet.resolve("hot")
        assert engine.pinned == {old.int_id}
        with fleet.lease(old):
            os.replace(
                staged(world, "hot2", seed=5) / "adapter_model.safetensors",
                root / "hot" / "adapter_model.safetensors",
            )
            await fleet.rescan()
            new = fleet.resolve("hot")
            assert new.int_id != old.int_id
            assert engine.pinned == {old.int_id}  # over budget until the old one leaves
        await asyncio.sleep(0.05)  # the drop runs as a task on the loop
        assert engine.pinned == {new.int_id}
        assert [a["pinned"] for a in (await fleet.describe())["adapters"]] == [True]

    run(fleet, engine, scenario)


def test_an_engine_that_cannot_pin_serves_unpinned_and_says_so(tmp_path, world):
    _, root, _, logs = world
    publish(staged(world, "hot"), root, "hot")
    engine = PinningEngine(refuse_pins=True)
    fleet = new_fleet(tmp_path, world, pinned=("hot",), pin_budget=1)

    async def scenario():
        assert fleet.resolve("hot") is not None
        assert [a["pinned"] for a in (await fleet.describe())["adapters"]] == [False]
        await fleet.rescan()

    run(fleet, engine, scenario)
    warnings = [line for line in logs if "could not pin adapter 'hot'" in line]
    assert len(warnings) == 1, logs  # warned once, not at every rescan


def _settings(tmp_path: Path, **engine_args) -> EngineSettings:
    raw = {
        "model": str(tmp_path),
        "enable_lora": True,
        "max_loras": 2,
        "max_cpu_loras": 4,
        "serving": {"adapters": {"pinned": ["a", "b"]}},
        **engine_args,
    }
    return EngineSettings.from_dict(raw, model_dir=tmp_path)


def test_pinned_names_must_leave_a_batch_room_in_the_cache(tmp_path):
    assert _settings(tmp_path).serving.adapters.pinned == ("a", "b")  # 4 - 2 = 2 pins
    with pytest.raises(ConfigError) as err:
        _settings(tmp_path, max_cpu_loras=3)
    assert "pinned names 2 adapter(s)" in str(err.value)
    assert "at most max_cpu_loras - max_loras = 1" in str(err.value)
    with pytest.raises(ConfigError) as err:
        _settings(tmp_path, enable_lora=False)
    assert "serving.adapters.pinned needs enable_lora" in str(err.value)
