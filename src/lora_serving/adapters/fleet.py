"""The adapters a model serves, changed while it runs: added, replaced and removed with no
restart of Triton or the engine.

- Each loaded version gets a new lora_int_id from a counter (vLLM caches adapters by id) and is
  served from its own snapshot (sources.Snapshots), checked like multi_lora.json's
  adapters always were (catalog.load_adapter) plus base-model fit (checks), then loaded
  into the engine once (`add_lora`), so vLLM's own checks run where a failure is only a refusal.
- Requests lease the version they run on (`lease`). A removed or replaced version leaves the
  name at once, so later requests see `unknown adapter` or the new weights, and is dropped
  from the engine (`remove_lora`) and disk when its last in-flight request ends.
- Rescans reconcile the file sources (multi_lora.json, adapter roots) with what is served:
  new folders are added, changed ones replaced, vanished ones removed; a refused adapter is
  reported and the others keep serving. Names a control request loaded or unloaded belong to
  the control requests until `load name` (no path) hands them back to the file sources.

Threads: changes and leases run on the engine loop (changes one at a time, under an asyncio
lock); `resolve` runs on Triton's thread. The name table is guarded by one lock.
"""

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from lora_serving.adapters.catalog import (
    Adapter,
    check_adapter_name,
    load_adapter,
    requested_adapter,
)
from lora_serving.adapters.checks import BaseModel
from lora_serving.adapters.pinning import PinnedAdapters
from lora_serving.adapters.sources import (
    CONTROL,
    MULTI_LORA,
    AdapterSources,
    Candidate,
    Snapshots,
    SourceScan,
    fingerprint,
)
from lora_serving.errors import AdapterUnavailable, ConfigError, InvalidRequest, UnknownAdapter
from lora_serving.metrics import AdapterStates, MetricsSink, NoMetrics
from lora_serving.settings import EngineSettings

STATE_INTERVAL_S = 5.0  # how often the adapter-state gauges are refreshed from the engine
LOADED, CACHED, REGISTERED = "loaded", "cached", "registered"


class EngineLoRA(Protocol):
    """What the fleet needs from the engine (EngineHost implements it; loop thread only)."""

    async def add_lora(self, adapter: Adapter) -> None: ...

    async def remove_lora(self, int_id: int) -> None: ...

    async def pin_lora(self, int_id: int) -> None:
        """Keep a loaded adapter in the engine's adapter cache (adapters.pinning)."""

    async def lora_state(self) -> tuple[set[int], set[int]]:
        """(ids in the engine's LoRA slots, ids in its adapter cache)."""
        ...


Validate = Callable[..., Adapter]  # load_adapter with the model's limits bound


@dataclass(eq=False)
class _Version:
    adapter: Adapter
    candidate: Candidate  # where it came from, as last scanned
    snapshot: tuple = ()  # fingerprint of the snapshot the engine reads, as checked
    in_flight: int = 0
    retired: bool = False
    dropped: bool = False
    broken: bool = False  # its snapshot changed on disk (reported once)


@dataclass
class _Refused:
    fingerprint: tuple | None
    message: str


@dataclass
class ScanReport:
    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)  # left alone: owned by control requests
    problems: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.replaced or self.removed)

    def as_dict(self) -> dict[str, Any]:
        return {
            "added": self.added,
            "replaced": self.replaced,
            "removed": self.removed,
            "refused": self.refused,
            "held": self.held,
            "problems": self.problems,
        }


class AdapterFleet:
    def __init__(
        self,
        *,
        sources: AdapterSources,
        snapshots: Snapshots,
        validate: Validate,
        enabled: bool = True,
        limits: dict[str, int] | None = None,
        rescan_interval_s: float = 0.0,
        log: Callable[[str], None] = print,
        warn: Callable[[str], None] | None = None,
        metrics: MetricsSink | None = None,
        pinned: tuple[str, ...] = (),
        pin_budget: int | None = None,
    ):
        self.enabled = enabled
        self.limits = limits or {}
        self._sources = sources
        self._snapshots = snapshots
        self._validate = validate
        self._rescan_interval_s = rescan_interval_s
        self._log = log
        self._warn = warn or log
        self._metrics = metrics or NoMetrics()
        budget = len(set(pinned)) if pin_budget is None else pin_budget
        self._pins = PinnedAdapters(pinned, budget, self._warn)
        self._engine: EngineLoRA | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()  # guards the tables below
        self._serving: dict[str, _Version] = {}
        self._by_id: dict[int, _Version] = {}  # every version the engine may still use
        self._held: dict[str, str] = {}  # name -> "loaded" | "unloaded" by a control request
        self._versions: dict[str, int] = {}  # name -> last version number
        self._refused: dict[str, _Refused] = {}
        self._problems: set[str] = set()  # unreadable sources, logged when they first appear
        self._state_error: str | None = None  # last failure to read the engine's state
        self._ids = itertools.count(1)
        self._pending: list[tuple[Candidate, Adapter]] = []
        self._changes = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()

    @classmethod
    def from_settings(
        cls,
        settings: EngineSettings,
        *,
        label: str,
        module_check: Callable[[set[str]], list[str]] | None = None,
        **kwargs,
    ) -> "AdapterFleet":
        options = settings.serving.adapters
        enabled = settings.lora_enabled
        multi_lora = settings.multi_lora_path if enabled else None
        base = BaseModel.from_folder(Path(settings.engine_args["model"]), options.base_model_names)
        validate = partial(
            load_adapter,
            max_lora_rank=settings.max_lora_rank,
            module_check=module_check,
            base_model=base,
        )
        return cls(
            sources=AdapterSources(multi_lora, options.roots if enabled else ()),
            snapshots=Snapshots(options.snapshot_dir, label),
            validate=validate,
            enabled=enabled,
            limits={
                "max_loras": settings.max_loras,
                "max_cpu_loras": settings.max_cpu_loras,
                "max_lora_rank": settings.max_lora_rank,
            },
            rescan_interval_s=options.rescan_interval_s,
            pinned=options.pinned,
            pin_budget=settings.max_cpu_loras - settings.max_loras,
            **kwargs,
        )

    # ---- what requests see (any thread) ------------------------------------------------------
    @property
    def names(self) -> list[str]:
        with self._lock:
            return list(self._serving)

    def __iter__(self) -> Iterator[Adapter]:
        with self._lock:
            return iter([version.adapter for version in self._serving.values()])

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
    def lease(self, adapter: Adapter | None):
        """Hold an adapter version for one job; yields the version to run on.

        A version replaced since the request was decoded gives way to the newest one; a
        removed adapter raises UnknownAdapter.
        """
        if adapter is None:
            yield None
            return
        version = self._acquire(adapter)
        try:
            self._check_snapshot(version)
            yield version.adapter
        finally:
            self._release(version)

    def _check_snapshot(self, version: _Version) -> None:
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

    def _acquire(self, adapter: Adapter) -> _Version:
        with self._lock:
            version = self._by_id.get(adapter.int_id)
            if version is None or version.retired:
                version = self._serving.get(adapter.name)
                if version is None:
                    raise UnknownAdapter(adapter.name, list(self._serving))
            version.in_flight += 1
            return version

    def _release(self, version: _Version) -> None:
        with self._lock:
            version.in_flight -= 1
            drop = version.retired and version.in_flight == 0
        if drop:
            self._spawn(self._drop(version))

    # ---- start and stop ----------------------------------------------------------------------
    def prepare(self) -> None:
        """Check every adapter the sources hold, before the engine starts.

        A bad multi_lora.json entry fails the model load, every problem listed (the file is
        the operator's explicit list); a bad folder in a root is only refused.
        """
        scan = self._sources.scan()
        problems = [ref.message for ref in scan.refused.values() if ref.source == MULTI_LORA]
        if MULTI_LORA in scan.unreadable:
            problems.append(scan.unreadable[MULTI_LORA])
        self._note_problems(scan)
        self._remember_refusals(scan)
        for candidate in scan.candidates.values():
            try:
                adapter = self._snapshot_and_check(candidate, next(self._ids))
            except ConfigError as err:
                self._refuse_at_start(candidate, err, problems)
                continue
            self._pending.append((candidate, adapter))
        if problems:
            self._discard_pending()
            raise ConfigError("adapters", problems)

    def _refuse_at_start(self, candidate, err: ConfigError, problems: list[str]) -> None:
        """A bad multi_lora.json entry fails the load (collected); a root folder is refused."""
        if candidate.source == MULTI_LORA:
            problems.append(str(err))
        else:
            self._refuse(candidate, str(err))

    async def start(self, engine: EngineLoRA) -> None:
        """Load the prepared adapters into the engine, then start the background rescans."""
        self._engine, self._loop = engine, asyncio.get_running_loop()
        self._pins.reset()
        problems = []
        for candidate, adapter in self._pending:
            try:
                await self._load_into_engine(adapter, candidate)
            except ConfigError as err:
                self._refuse_at_start(candidate, err, problems)
                continue
            await self._publish(adapter, candidate)
        self._pending.clear()
        if problems:
            raise ConfigError("adapters", problems)
        if self._rescan_interval_s > 0 and self._sources.roots:
            self._spawn(self._rescan_forever(self._rescan_interval_s))
        if self.enabled:
            self._spawn(self._report_states_forever())

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def close(self) -> None:
        """Remove every snapshot (the engine is gone by now)."""
        self._discard_pending()
        self._snapshots.close()

    # ---- changes (engine loop) ---------------------------------------------------------------
    async def rescan(self) -> ScanReport:
        """Bring the served set in line with multi_lora.json and the roots."""
        async with self._changes:
            scan = await asyncio.to_thread(self._sources.scan)
            report = ScanReport(problems=list(scan.unreadable.values()))
            self._note_problems(scan)
            with self._lock:
                held = set(self._held)
                gone = [
                    name
                    for name, version in self._serving.items()
                    if name not in held
                    and version.adapter.source != CONTROL
                    and name not in scan.candidates
                    and _source_key(version.candidate) not in scan.unreadable
                ]
            for name in gone:
                await self._remove(name)
                report.removed.append(name)
            for name, candidate in scan.candidates.items():
                if name in held:
                    report.held.append(name)
                    continue
                await self._reconcile(candidate, report)
            self._remember_refusals(scan)
            for name, refusal in scan.refused.items():
                report.refused.setdefault(name, refusal.message)
            for name in list(self._refused):
                if name not in scan.candidates and name not in scan.refused:
                    del self._refused[name]
        if report.changed:
            self._log(
                f"adapters: added {report.added or '-'}, replaced {report.replaced or '-'}, "
                f"removed {report.removed or '-'}; serving {len(self)}"
            )
            await self._report_states()
        return report

    async def _reconcile(self, candidate: Candidate, report: ScanReport) -> None:
        name = candidate.name
        with self._lock:
            current = self._serving.get(name)
        if current is not None and current.candidate == candidate:
            return
        refused = self._refused.get(name)
        if refused is not None and refused.fingerprint == candidate.fingerprint:
            report.refused[name] = refused.message  # unchanged since: not retried
            return
        try:
            adapter = await self._admit(candidate)
        except ConfigError as err:
            message = str(err)
            if current is not None:
                message += f" (version {current.adapter.version} keeps serving)"
            self._refuse(candidate, message)
            report.refused[name] = message
            return
        self._refused.pop(name, None)
        replaced = await self._publish(adapter, candidate)
        (report.replaced if replaced else report.added).append(name)

    async def load(self, name: str, path: str | None = None) -> dict[str, Any]:
        """Load (or replace) `name` from a folder inside a root; without a path, reload it from
        its file source and hand the name back to the rescans."""
        check_adapter_name(name)
        async with self._changes:
            if path is None:
                scan = await asyncio.to_thread(self._sources.scan)
                candidate = scan.candidates.get(name)
                if candidate is None:
                    refusal = scan.refused.get(name)
                    raise InvalidRequest(
                        refusal.message
                        if refusal
                        else f"no adapter root or multi_lora.json provides an adapter '{name}'"
                    )
            else:
                candidate = await asyncio.to_thread(self._sources.locate, name, path)
            try:
                adapter = await self._admit(candidate)
            except ConfigError as err:
                raise InvalidRequest(str(err)) from None
            with self._lock:
                if path is None:
                    self._held.pop(name, None)
                else:
                    self._held[name] = "loaded"
            self._refused.pop(name, None)
            replaced = await self._publish(adapter, candidate)
        self._log(f"adapter '{name}' {'replaced' if replaced else 'loaded'}: {adapter.origin}")
        await self._report_states()
        return {
            "loaded": name,
            "version": adapter.version,
            "id": adapter.int_id,
            "replaced": replaced,
        }

    async def unload(self, name: str) -> dict[str, Any]:
        """Stop serving `name` now, whatever its source. A name from multi_lora.json or a root
        stays out of rescans until `load name`; a name loaded by a command is simply free."""
        check_adapter_name(name)
        async with self._changes:
            with self._lock:
                version = self._serving.get(name)
                if version is None:
                    raise UnknownAdapter(name, list(self._serving))
                if version.adapter.source == CONTROL:
                    self._held.pop(name, None)
                else:
                    self._held[name] = "unloaded"
            in_flight = await self._remove(name)
        self._log(f"adapter '{name}' unloaded ({in_flight} request(s) still running on it)")
        await self._report_states()
        return {"unloaded": name, "in_flight": in_flight}

    # ---- listing -----------------------------------------------------------------------------
    async def describe(self) -> dict[str, Any]:
        slots, cached = await self._engine_state()
        with self._lock:
            serving = [
                _describe(v, _state(v.adapter.int_id, slots, cached), self._pins)
                for v in self._serving.values()
            ]
            retiring = [
                _describe(v, _state(v.adapter.int_id, slots, cached), self._pins)
                for v in self._by_id.values()
                if v.retired and not v.dropped
            ]
            unloaded = sorted(name for name, how in self._held.items() if how == "unloaded")
        return {
            "adapters": sorted(serving, key=lambda item: item["name"]),
            "retiring": retiring,
            "refused": {name: refused.message for name, refused in sorted(self._refused.items())},
            "unloaded": unloaded,
            "limits": self.limits,
            "pinned": sorted(self._pins.names),
            "roots": self._sources.describe_roots(),
            "rescan_interval_s": self._rescan_interval_s,
        }

    # ---- internals ---------------------------------------------------------------------------
    def _snapshot_and_check(self, candidate: Candidate, int_id: int) -> Adapter:
        snapshot = self._snapshots.take(candidate, int_id)
        try:
            return self._validate(
                candidate.name,
                snapshot,
                int_id,
                source=candidate.source,
                origin=candidate.folder,
                version=self._versions.get(candidate.name, 0) + 1,
            )
        except BaseException:
            self._snapshots.remove(snapshot)
            raise

    async def _admit(self, candidate: Candidate) -> Adapter:
        """Snapshot, check and load one version into the engine; ConfigError if refused."""
        adapter = await asyncio.to_thread(self._snapshot_and_check, candidate, next(self._ids))
        await self._load_into_engine(adapter, candidate)
        return adapter

    async def _load_into_engine(self, adapter: Adapter, candidate: Candidate) -> None:
        try:
            await self._engine.add_lora(adapter)
        except Exception as err:
            try:
                await self._engine.remove_lora(adapter.int_id)  # in case it got half-way in
            except Exception:
                pass
            await asyncio.to_thread(self._snapshots.remove, adapter.path)
            where = f"adapter '{candidate.name}' ({candidate.folder})"
            raise ConfigError(where, [f"the engine refused it: {err}"]) from None

    async def _publish(self, adapter: Adapter, candidate: Candidate) -> bool:
        """Serve `adapter` under its name; True if it replaced a version (now retiring)."""
        version = _Version(adapter, candidate, snapshot=fingerprint(adapter.path))
        with self._lock:
            old = self._serving.get(adapter.name)
            self._serving[adapter.name] = version
            self._by_id[adapter.int_id] = version
            self._versions[adapter.name] = adapter.version
        if old is not None:
            await self._retire(old)
        await self._pin_wanted()
        return old is not None

    async def _remove(self, name: str) -> int:
        with self._lock:
            version = self._serving.pop(name)
        return await self._retire(version)

    async def _retire(self, version: _Version) -> int:
        """Take a version out of service: drop it now, or when its last request ends."""
        with self._lock:
            version.retired = True
            in_flight = version.in_flight
        if in_flight == 0:
            await self._drop(version)
        return in_flight

    async def _drop(self, version: _Version) -> None:
        with self._lock:
            if version.dropped:
                return
            version.dropped = True
            self._by_id.pop(version.adapter.int_id, None)
        try:
            await self._engine.remove_lora(version.adapter.int_id)
        except Exception as err:  # the engine may be shutting down; the snapshot still goes
            self._warn(f"could not remove adapter id {version.adapter.int_id}: {err!r}")
        self._pins.forget(version.adapter.int_id)
        await asyncio.to_thread(self._snapshots.remove, version.adapter.path)
        await self._pin_wanted()  # a replaced pinned version's successor may pin now

    async def _pin_wanted(self) -> None:
        if self._engine is None or not self._pins.names:
            return
        with self._lock:
            serving = [version.adapter for version in self._serving.values()]
        await self._pins.pin_wanted(serving, self._engine.pin_lora)

    def _refuse(self, candidate: Candidate | None, message: str, name: str = "") -> None:
        """Remember why an adapter was refused (logged once per new reason)."""
        name = candidate.name if candidate is not None else name
        known = self._refused.get(name)
        if known is None or known.message != message:
            self._warn(f"adapter '{name}' refused: {message}")
        self._refused[name] = _Refused(candidate.fingerprint if candidate else None, message)

    def _note_problems(self, scan: SourceScan) -> None:
        problems = set(scan.unreadable.values())
        for problem in sorted(problems - self._problems):
            self._warn(problem)
        self._problems = problems

    def _remember_refusals(self, scan: SourceScan) -> None:
        """Names a source offers but cannot serve (bad name, outside its root, duplicate)."""
        for name, refusal in scan.refused.items():
            if name in scan.candidates:  # a duplicate: the first source's adapter is served
                if name not in self._refused:
                    self._warn(refusal.message)
                continue
            self._refuse(None, refusal.message, name=name)

    def _discard_pending(self) -> None:
        for _, adapter in self._pending:
            self._snapshots.remove(adapter.path)
        self._pending.clear()

    def _spawn(self, coroutine) -> None:
        """Run a coroutine on the engine loop (from the loop or any other thread)."""
        loop = self._loop
        if loop is None:
            coroutine.close()
            return

        def create() -> None:
            task = loop.create_task(coroutine)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        loop.call_soon_threadsafe(create)

    async def _engine_state(self) -> tuple[set[int], set[int]]:
        """What the engine holds; empty (all "registered") if it cannot tell (logged once)."""
        if self._engine is None or not self.enabled:
            return set(), set()
        try:
            state = await self._engine.lora_state()
        except Exception as err:
            message = f"could not read the engine's adapter state: {err}"
            if message != self._state_error:
                self._warn(message)
            self._state_error = message
            return set(), set()
        self._state_error = None
        return state

    async def _report_states(self) -> None:
        slots, cached = await self._engine_state()
        counts = {LOADED: 0, CACHED: 0, REGISTERED: 0}
        with self._lock:
            for version in self._serving.values():
                counts[_state(version.adapter.int_id, slots, cached)] += 1
        self._metrics.record(AdapterStates(counts))

    async def _report_states_forever(self) -> None:
        while True:
            await self._report_states()
            await asyncio.sleep(STATE_INTERVAL_S)

    async def _rescan_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.rescan()
            except Exception as err:  # keep rescanning; the next scan may succeed
                self._warn(f"adapter rescan failed: {err!r}")


def _source_key(candidate: Candidate) -> str:
    """The key SourceScan.unreadable uses for the source a candidate came from."""
    return str(candidate.root) if candidate.root is not None else candidate.source


def _state(int_id: int, slots: set[int], cached: set[int]) -> str:
    if int_id in slots:
        return LOADED
    return CACHED if int_id in cached else REGISTERED


def _describe(version: _Version, state: str, pins: PinnedAdapters) -> dict[str, Any]:
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
        "pinned": pins.is_pinned(adapter.int_id),
    }
