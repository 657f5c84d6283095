"""One adapter version into the engine and out again (engine loop, and worker threads for
the disk and network parts).

  take   the candidate's source writes its snapshot (adapters.snapshots), which is checked
         (catalog.load_adapter with the model's limits): an Adapter with a new id, never reused
  admit  take, then add_lora, so vLLM's own checks run where a failure is only a refusal;
         ConfigError: refused; SourceUnavailable: its source could not deliver it just now.
         Nothing is left behind either way.
  drop   remove_lora, unpin, snapshot removed; pinned names get their pins again as they free
"""

import asyncio
import itertools
from collections.abc import Callable
from typing import Protocol

from lora_serving.adapters.catalog import Adapter
from lora_serving.adapters.pinning import PinnedAdapters
from lora_serving.adapters.registry import AdapterRegistry, Version
from lora_serving.adapters.snapshots import Snapshots
from lora_serving.adapters.sources import Candidate
from lora_serving.errors import ConfigError

Validate = Callable[..., Adapter]  # load_adapter with the model's limits bound


class EngineLoRA(Protocol):
    """What the fleet needs from the engine (EngineHost implements it; loop thread only)."""

    async def add_lora(self, adapter: Adapter) -> None: ...

    async def remove_lora(self, int_id: int) -> None: ...

    async def pin_lora(self, int_id: int) -> None:
        """Keep a loaded adapter in the engine's adapter cache (adapters.pinning)."""

    async def lora_state(self) -> tuple[set[int], set[int]]:
        """(ids in the engine's LoRA slots, ids in its adapter cache)."""
        ...


class VersionLoader:
    def __init__(
        self,
        snapshots: Snapshots,
        validate: Validate,
        registry: AdapterRegistry,
        pins: PinnedAdapters,
        warn: Callable[[str], None],
    ):
        self.snapshots = snapshots
        self.validate = validate
        self.engine: EngineLoRA | None = None
        self._registry = registry
        self._pins = pins
        self._warn = warn
        self._ids = itertools.count(1)

    def take(self, candidate: Candidate) -> Adapter:
        int_id = next(self._ids)
        snapshot = self.snapshots.take(candidate, int_id)
        try:
            return self.validate(
                candidate.name,
                snapshot,
                int_id,
                source=candidate.source,
                origin=candidate.origin,
                version=self._registry.next_version(candidate.name),
            )
        except BaseException:
            self.snapshots.remove(snapshot)
            raise

    async def admit(self, candidate: Candidate) -> Adapter:
        adapter = await asyncio.to_thread(self.take, candidate)
        await self.load_into_engine(adapter, candidate)
        return adapter

    async def load_into_engine(self, adapter: Adapter, candidate: Candidate) -> None:
        try:
            await self.engine.add_lora(adapter)
        except Exception as err:
            try:
                await self.engine.remove_lora(adapter.int_id)  # in case it got half-way in
            except Exception:
                pass
            await asyncio.to_thread(self.snapshots.remove, adapter.path)
            where = f"adapter '{candidate.name}' ({candidate.origin})"
            raise ConfigError(where, [f"the engine refused it: {err}"]) from None

    async def drop(self, version: Version) -> None:
        if not self._registry.mark_dropped(version):
            return
        try:
            await self.engine.remove_lora(version.adapter.int_id)
        except Exception as err:  # the engine may be shutting down; the snapshot still goes
            self._warn(f"could not remove adapter id {version.adapter.int_id}: {err!r}")
        self._pins.forget(version.adapter.int_id)
        await asyncio.to_thread(self.snapshots.remove, version.adapter.path)
        await self.pin_wanted()  # a replaced pinned version's successor may pin now

    async def pin_wanted(self) -> None:
        if self.engine is None or not self._pins.names:
            return
        await self._pins.pin_wanted(self._registry.adapters(), self.engine.pin_lora)
