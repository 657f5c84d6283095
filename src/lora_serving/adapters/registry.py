"""The fleet's registry: which version serves each name, every version the engine may still
use (by id), the requests leasing each, names held by control requests, version numbers.

One lock guards it all; any thread may call it (requests resolve and lease on Triton's and the
engine loop's threads, changes come from the loop). It never touches the engine or the disk:
AdapterFleet does, with what the registry tells it.
"""

import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from lora_serving.adapters.catalog import Adapter, requested_adapter
from lora_serving.adapters.folders import fingerprint
from lora_serving.adapters.sources import CONTROL, Candidate
from lora_serving.errors import AdapterUnavailable, UnknownAdapter

LOADED, CACHED, REGISTERED = "loaded", "cached", "registered"
UNLOADED = "unloaded"  # held: a control request took a file source's name out of service


@dataclass(eq=False)
class Version:
    adapter: Adapter
    candidate: Candidate  # where it came from, as last scanned
    snapshot: tuple = ()  # fingerprint of the snapshot the engine reads, as checked
    in_flight: int = 0
    retired: bool = False
    dropped: bool = False
    broken: bool = False  # its snapshot changed on disk (reported once)


class AdapterRegistry:
    def __init__(self, *, enabled: bool, warn: Callable[[str], None] = print):
        self.enabled = enabled
        self._warn = warn
        self._lock = threading.Lock()
        self._serving: dict[str, Version] = {}
        self._by_id: dict[int, Version] = {}  # every version the engine may still use
        self._held: dict[str, str] = {}  # name -> "loaded" | "unloaded" by a control request
        self._versions: dict[str, int] = {}  # name -> last version number

    # ---- what requests see -------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        with self._lock:
            return list(self._serving)

    def adapters(self) -> list[Adapter]:
        with self._lock:
            return [version.adapter for version in self._serving.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._serving)

    def resolve(self, name: str | None) -> Adapter | None:
        """None or "" means the base model; anything else must be a served adapter."""
        if not requested_adapter(name, lora_enabled=self.enabled):
            return None
        with self._lock:
            version = self._serving.get(name)
            if version is None:
                raise UnknownAdapter(name, list(self._serving))
            return version.adapter

    @contextmanager
    def lease(self, adapter: Adapter | None, on_idle: Callable[[Version], None]):
        """Hold an adapter version for one job; yields the version to run on.

        A version replaced since the request was decoded gives way to the newest one; a
        removed adapter raises UnknownAdapter. `on_idle(version)` runs when the last lease
        of a retired version ends.
        """
        if adapter is None:
            yield None
            return
        version = self.acquire(adapter)
        try:
            self._check_snapshot(version)
            yield version.adapter
        finally:
            if self.release(version):
                on_idle(version)

    def _check_snapshot(self, version: Version) -> None:
        """The engine reads a version's snapshot whenever it is not in its adapter cache, and
        vLLM fails the whole engine on weights it cannot load: refuse the request instead if
        the checked files were changed or deleted (two stat calls)."""
        if fingerprint(version.adapter.path) == version.snapshot:
            return
        name = version.adapter.name
        message = (
            f"adapter '{name}' cannot be served: its checked snapshot {version.adapter.path} "
            f"was changed or deleted on disk; `load {name}` (or a rescan after changing its "
            "folder) takes it again"
        )
        if not version.broken:
            version.broken = True
            self._warn(message)
        raise AdapterUnavailable(message)

    def acquire(self, adapter: Adapter) -> Version:
        """Lease the adapter's version, or the newest one of its name if it was replaced."""
        with self._lock:
            version = self._by_id.get(adapter.int_id)
            if version is None or version.retired:
                version = self._serving.get(adapter.name)
                if version is None:
                    raise UnknownAdapter(adapter.name, list(self._serving))
            version.in_flight += 1
            return version

    def release(self, version: Version) -> bool:
        """End a lease; True if the version is retired and nothing runs on it any more."""
        with self._lock:
            version.in_flight -= 1
            return version.retired and version.in_flight == 0

    # ---- changes -----------------------------------------------------------------------------
    def serving(self, name: str) -> Version | None:
        with self._lock:
            return self._serving.get(name)

    def next_version(self, name: str) -> int:
        with self._lock:
            return self._versions.get(name, 0) + 1

    def publish(self, version: Version) -> Version | None:
        """Serve `version` under its name; the version it replaces (to retire), if any."""
        adapter = version.adapter
        with self._lock:
            old = self._serving.get(adapter.name)
            self._serving[adapter.name] = version
            self._by_id[adapter.int_id] = version
            self._versions[adapter.name] = adapter.version
        return old

    def take_out(self, name: str) -> Version:
        """Stop serving `name` (UnknownAdapter if it is not served); its version to retire."""
        with self._lock:
            version = self._serving.pop(name, None)
            if version is None:
                raise UnknownAdapter(name, list(self._serving))
            return version

    def retire(self, version: Version) -> int:
        """Mark a version out of service; the requests still running on it."""
        with self._lock:
            version.retired = True
            return version.in_flight

    def mark_dropped(self, version: Version) -> bool:
        """Forget a version's id; False if it was dropped already."""
        with self._lock:
            if version.dropped:
                return False
            version.dropped = True
            self._by_id.pop(version.adapter.int_id, None)
            return True

    # ---- names control requests hold -----------------------------------------------------------
    def held(self) -> dict[str, str]:
        with self._lock:
            return dict(self._held)

    def hold(self, name: str, how: str) -> None:
        with self._lock:
            self._held[name] = how

    def hand_back(self, name: str) -> None:
        with self._lock:
            self._held.pop(name, None)

    def gone(self, candidates, unreadable) -> list[str]:
        """Served names a rescan no longer finds: not held, not loaded by a command, and not
        from a source that could not be read this time."""
        with self._lock:
            return [
                name
                for name, version in self._serving.items()
                if name not in self._held
                and version.adapter.source != CONTROL
                and name not in candidates
                and version.candidate.source_key not in unreadable
            ]

    # ---- listing -----------------------------------------------------------------------------
    def listing(
        self, slots: set[int], cached: set[int], pinned: Callable[[int], bool]
    ) -> dict[str, Any]:
        with self._lock:
            serving = [
                _describe(v, _state(v, slots, cached), pinned) for v in self._serving.values()
            ]
            retiring = [
                _describe(v, _state(v, slots, cached), pinned)
                for v in self._by_id.values()
                if v.retired and not v.dropped
            ]
            unloaded = sorted(name for name, how in self._held.items() if how == UNLOADED)
        return {
            "adapters": sorted(serving, key=lambda item: item["name"]),
            "retiring": retiring,
            "unloaded": unloaded,
        }

    def state_counts(self, slots: set[int], cached: set[int]) -> dict[str, int]:
        counts = {LOADED: 0, CACHED: 0, REGISTERED: 0}
        with self._lock:
            for version in self._serving.values():
                counts[_state(version, slots, cached)] += 1
        return counts


def _state(version: Version, slots: set[int], cached: set[int]) -> str:
    int_id = version.adapter.int_id
    if int_id in slots:
        return LOADED
    return CACHED if int_id in cached else REGISTERED


def _describe(version: Version, state: str, pinned: Callable[[int], bool]) -> dict[str, Any]:
    adapter = version.adapter
    return {
        "name": adapter.name,
        "state": state,
        "rank": adapter.rank,
        "target_modules": list(adapter.target_modules),
        "path": str(adapter.origin or adapter.path),
        "snapshot": str(adapter.path),  # the private copy the engine reads
        "source": adapter.source,
        "version": adapter.version,
        "id": adapter.int_id,
        "in_flight": version.in_flight,
        "pinned": pinned(adapter.int_id),
    }
