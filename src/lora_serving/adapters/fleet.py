"""The adapters a model serves, changed while it runs: added, replaced and removed with no
restart of Triton or the engine.

- Each loaded version gets a new lora_int_id from a counter (vLLM caches adapters by id) and is
  served from its own snapshot (adapters.snapshots), checked like multi_lora.json's
  adapters always were (catalog.load_adapter) plus base-model fit (checks), then loaded
  into the engine once (`add_lora`), so vLLM's own checks run where a failure is only a refusal.
- Requests lease the version they run on (`lease`). A removed or replaced version leaves the
  name at once, so later requests see `unknown adapter` or the new weights, and is dropped
  from the engine (`remove_lora`) and disk when its last in-flight request ends.
- Rescans reconcile the file sources (multi_lora.json, adapter roots) with what is served:
  new folders are added, changed ones replaced, vanished ones removed; a refused adapter is
  reported and the others keep serving. Names a control request loaded or unloaded belong to
  the control requests until `load name` (no path) hands them back to the file sources.

Where adapters come from is adapters.sources (one interface per kind of source); which
version serves each name, and who leases it, is adapters.registry; taking a version into the
engine and out again is adapters.loader. The fleet drives them: start, rescans, control
commands, listing.

Threads: changes and leases run on the engine loop (changes one at a time, under an asyncio
lock); `resolve` runs on Triton's thread. The registry has its own lock.
"""

import asyncio
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from lora_serving.adapters.catalog import Adapter, check_adapter_name, load_adapter
from lora_serving.adapters.checks import BaseModel
from lora_serving.adapters.folders import fingerprint
from lora_serving.adapters.loader import EngineLoRA, Validate, VersionLoader
from lora_serving.adapters.pinning import PinnedAdapters
from lora_serving.adapters.registry import UNLOADED, AdapterRegistry, Version
from lora_serving.adapters.reports import EngineStates, Refusals, ScanReport, SourceProblems
from lora_serving.adapters.snapshots import Snapshots
from lora_serving.adapters.sources import (
    CONTROL,
    MULTI_LORA,
    AdapterSources,
    Candidate,
    SourceUnavailable,
)
from lora_serving.errors import ConfigError, InvalidRequest
from lora_serving.metrics import MetricsSink, NoMetrics
from lora_serving.settings import EngineSettings

STATE_INTERVAL_S = 5.0  # how often the adapter-state gauges are refreshed from the engine


__all__ = ["AdapterFleet", "EngineLoRA", "ScanReport"]


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
        self._rescan_interval_s = rescan_interval_s
        self._log = log
        self._warn = warn or log
        self._metrics = metrics or NoMetrics()
        budget = len(set(pinned)) if pin_budget is None else pin_budget
        self._pins = PinnedAdapters(pinned, budget, self._warn)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._registry = AdapterRegistry(enabled=enabled, warn=self._warn)
        self._states = EngineStates(
            self._registry, enabled=enabled, warn=self._warn, metrics=self._metrics
        )
        self._refused = Refusals(self._warn)
        self._loader = VersionLoader(snapshots, validate, self._registry, self._pins, self._warn)
        self._problems = SourceProblems(
            sources.roots, log=self._log, warn=self._warn, metrics=self._metrics
        )
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
        base = BaseModel.from_folder(Path(settings.engine_args["model"]), options.base_model_names)
        validate = partial(
            load_adapter,
            max_lora_rank=settings.max_lora_rank,
            module_check=module_check,
            base_model=base,
        )
        return cls(
            sources=AdapterSources.from_settings(settings),
            snapshots=Snapshots(options.snapshot_dir, label),
            validate=validate,
            enabled=settings.lora_enabled,
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
        return self._registry.names

    def __iter__(self) -> Iterator[Adapter]:
        return iter(self._registry.adapters())

    def __len__(self) -> int:
        return len(self._registry)

    def resolve(self, name: str | None) -> Adapter | None:
        """None or "" means the base model; anything else must be a served adapter."""
        return self._registry.resolve(name)

    def lease(self, adapter: Adapter | None):
        """Hold an adapter version for one job (AdapterRegistry.lease); a retired version
        is dropped when its last lease ends."""
        return self._registry.lease(
            adapter, on_idle=lambda old: self._spawn(self._loader.drop(old))
        )

    # ---- start and stop ----------------------------------------------------------------------
    def prepare(self) -> None:
        """Check every adapter the sources hold, before the engine starts.

        A bad multi_lora.json entry fails the model load, every problem listed (the file is
        the operator's explicit list); a bad folder in a root is only refused, and a root that
        cannot be read (a store that is down) only reported.
        """
        scan = self._sources.scan()
        problems = [ref.message for ref in scan.refused.values() if ref.source == MULTI_LORA]
        if MULTI_LORA in scan.unreadable:
            problems.append(scan.unreadable[MULTI_LORA])
        self._problems.note(scan)
        self._refused.remember(scan)
        for candidate in scan.candidates.values():
            try:
                adapter = self._loader.take(candidate)
            except (ConfigError, SourceUnavailable) as err:
                self._refuse_at_start(candidate, err, problems)
                continue
            self._pending.append((candidate, adapter))
        if problems:
            self._discard_pending()
            raise ConfigError("adapters", problems)

    def _refuse_at_start(self, candidate, err: Exception, problems: list[str]) -> None:
        """A bad multi_lora.json entry fails the load (collected); a root's is refused."""
        if candidate.source == MULTI_LORA:
            problems.append(str(err))
        elif isinstance(err, SourceUnavailable):
            self._refused.unavailable(candidate, err)
        else:
            self._refused.refuse(candidate, str(err))

    async def start(self, engine: EngineLoRA) -> None:
        """Load the prepared adapters into the engine, then start the background rescans."""
        self._loader.engine, self._loop = engine, asyncio.get_running_loop()
        self._states.engine = engine
        self._pins.reset()
        problems = []
        for candidate, adapter in self._pending:
            try:
                await self._loader.load_into_engine(adapter, candidate)
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
            self._spawn(self._states.report_forever(STATE_INTERVAL_S))

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def close(self) -> None:
        """Remove every snapshot (the engine is gone by now)."""
        self._discard_pending()
        self._loader.snapshots.close()

    # ---- changes (engine loop) ---------------------------------------------------------------
    async def rescan(self) -> ScanReport:
        """Bring the served set in line with multi_lora.json and the roots."""
        async with self._changes:
            scan = await asyncio.to_thread(self._sources.scan)
            report = ScanReport(problems=list(scan.unreadable.values()))
            self._problems.note(scan)
            held = self._registry.held()
            for name in self._registry.gone(scan.candidates, scan.unreadable):
                await self._retire(self._registry.take_out(name))
                report.removed.append(name)
            for name, candidate in scan.candidates.items():
                if name in held:
                    report.held.append(name)
                    continue
                await self._reconcile(candidate, report)
            self._refused.remember(scan)
            for name, refusal in scan.refused.items():
                report.refused.setdefault(name, refusal.message)
            self._refused.keep_only([*scan.candidates, *scan.refused])
        if report.changed:
            self._log(
                f"adapters: added {report.added or '-'}, replaced {report.replaced or '-'}, "
                f"removed {report.removed or '-'}; serving {len(self)}"
            )
            await self._states.report()
        return report

    async def _reconcile(self, candidate: Candidate, report: ScanReport) -> None:
        name = candidate.name
        current = self._registry.serving(name)
        if current is not None and current.candidate == candidate:
            return
        unchanged = self._refused.unchanged(candidate)
        if unchanged is not None:
            report.refused[name] = unchanged  # unchanged since: not retried
            return
        try:
            adapter = await self._loader.admit(candidate)
        except (ConfigError, SourceUnavailable) as err:
            keeps = f" (version {current.adapter.version} keeps serving)" if current else ""
            if isinstance(err, SourceUnavailable):
                report.refused[name] = self._refused.unavailable(candidate, err, keeps)
            else:
                report.refused[name] = str(err) + keeps
                self._refused.refuse(candidate, report.refused[name])
            return
        self._refused.forget(name)
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
                adapter = await self._loader.admit(candidate)
            except (ConfigError, SourceUnavailable) as err:
                raise InvalidRequest(str(err)) from None
            if path is None:
                self._registry.hand_back(name)
            else:
                self._registry.hold(name, "loaded")
            self._refused.forget(name)
            replaced = await self._publish(adapter, candidate)
        self._log(f"adapter '{name}' {'replaced' if replaced else 'loaded'}: {adapter.origin}")
        await self._states.report()
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
            version = self._registry.take_out(name)  # UnknownAdapter if not served
            if version.adapter.source == CONTROL:
                self._registry.hand_back(name)
            else:
                self._registry.hold(name, UNLOADED)
            in_flight = await self._retire(version)
        self._log(f"adapter '{name}' unloaded ({in_flight} request(s) still running on it)")
        await self._states.report()
        return {"unloaded": name, "in_flight": in_flight}

    # ---- listing -----------------------------------------------------------------------------
    async def describe(self) -> dict[str, Any]:
        slots, cached = await self._states.read()
        listing = self._registry.listing(slots, cached, pinned=self._pins.is_pinned)
        return {
            "adapters": listing["adapters"],
            "retiring": listing["retiring"],
            "refused": self._refused.as_dict(),
            "unloaded": listing["unloaded"],
            "limits": self.limits,
            "pinned": sorted(self._pins.names),
            "roots": self._problems.annotate(self._sources.describe_roots()),
            "rescan_interval_s": self._rescan_interval_s,
        }

    # ---- internals ---------------------------------------------------------------------------
    async def _publish(self, adapter: Adapter, candidate: Candidate) -> bool:
        """Serve `adapter` under its name; True if it replaced a version (now retiring)."""
        version = Version(adapter, candidate, snapshot=fingerprint(adapter.path))
        old = self._registry.publish(version)
        if old is not None:
            await self._retire(old)
        await self._loader.pin_wanted()
        return old is not None

    async def _retire(self, version: Version) -> int:
        """Take a version out of service: drop it now, or when its last request ends."""
        in_flight = self._registry.retire(version)
        if in_flight == 0:
            await self._loader.drop(version)
        return in_flight

    def _discard_pending(self) -> None:
        for _, adapter in self._pending:
            self._loader.snapshots.remove(adapter.path)
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

    async def _rescan_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.rescan()
            except Exception as err:  # keep rescanning; the next scan may succeed
                self._warn(f"adapter rescan failed: {err!r}")
