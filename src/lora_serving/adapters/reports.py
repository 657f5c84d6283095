"""What the fleet reports, and remembers between rescans to report it: the rescan's report,
and for the listing and /metrics:

  Refusals        refused adapters and why, with the fingerprint each was refused at, so an
                  unchanged one is not checked again; one a source could not deliver just now
                  (SourceUnavailable) carries none and is tried again at the next rescan.
  SourceProblems  sources that could not be read (a folder unmounted, a store down) and since
                  when, shown in the listing and on /metrics until a scan reads them again.
  EngineStates    which served adapters sit in the engine's LoRA slots or its cache.
"""

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from lora_serving.adapters.sources import Candidate, SourceScan, SourceUnavailable
from lora_serving.metrics import AdapterRootErrors, AdapterStates, MetricsSink


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


@dataclass
class _Refused:
    fingerprint: tuple | None
    message: str


class Refusals:
    """Adapter name -> why it is not served (engine loop only)."""

    def __init__(self, warn: Callable[[str], None]):
        self._warn = warn
        self._by_name: dict[str, _Refused] = {}

    def unchanged(self, candidate: Candidate) -> str | None:
        """The message it was refused with, if refused at this very fingerprint."""
        known = self._by_name.get(candidate.name)
        if known is not None and known.fingerprint == candidate.fingerprint:
            return known.message
        return None

    def refuse(self, candidate: Candidate | None, message: str, name: str = "") -> None:
        """Remember why an adapter was refused (logged once per new reason)."""
        name = candidate.name if candidate is not None else name
        known = self._by_name.get(name)
        if known is None or known.message != message:
            self._warn(f"adapter '{name}' refused: {message}")
        self._by_name[name] = _Refused(candidate.fingerprint if candidate else None, message)

    def unavailable(self, candidate: Candidate, err: SourceUnavailable, keeps: str = "") -> str:
        """Its source could not deliver it now: shown as refused, tried again next rescan."""
        message = f"adapter '{candidate.name}' ({candidate.origin}): {err}{keeps}"
        self.refuse(None, message, name=candidate.name)  # no fingerprint: retried
        return message

    def remember(self, scan: SourceScan) -> None:
        """Names a source offers but cannot serve (bad name, outside its root, duplicate)."""
        for name, refusal in scan.refused.items():
            if name in scan.candidates:  # a duplicate: the first source's adapter is served
                if name not in self._by_name:
                    self._warn(refusal.message)
                continue
            self.refuse(None, refusal.message, name=name)

    def forget(self, name: str) -> None:
        self._by_name.pop(name, None)

    def keep_only(self, names: Iterable[str]) -> None:
        """Forget names no source holds any more."""
        keep = set(names)
        for name in [name for name in self._by_name if name not in keep]:
            del self._by_name[name]

    def as_dict(self) -> dict[str, str]:
        return {name: refused.message for name, refused in sorted(self._by_name.items())}


class SourceProblems:
    """Unreadable sources -> (why, since when: Unix time); each logged when it appears and when
    it clears. The roots' are reported as AdapterRootErrors (0: readable)."""

    def __init__(self, roots, *, log, warn, metrics: MetricsSink):
        self._roots = [str(root) for root in roots]
        self._log, self._warn, self._metrics = log, warn, metrics
        self._problems: dict[str, tuple[str, float]] = {}
        self._reported: dict[str, float] | None = None

    def note(self, scan: SourceScan) -> None:
        now = time.time()
        problems = {}
        for key, message in scan.unreadable.items():
            known = self._problems.get(key)
            if known is None or known[0] != message:
                self._warn(message)
            problems[key] = (message, known[1] if known else now)
        for key in sorted(set(self._problems) - set(problems)):
            self._log(f"adapter source {key} is readable again")
        self._problems = problems
        errors = {root: problems[root][1] if root in problems else 0.0 for root in self._roots}
        if errors != self._reported:
            self._reported = errors
            self._metrics.record(AdapterRootErrors(errors))

    def annotate(self, roots: list[dict]) -> list[dict]:
        """The listing's roots, each failing one with its error and since when (UTC)."""
        for root in roots:
            problem = self._problems.get(root["path"])
            if problem is not None:
                root["error"] = problem[0]
                root["error_since"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(problem[1]))
        return roots


class EngineStates:
    """What the engine holds, for the listing and the lora_adapters{state} gauges (loop only)."""

    def __init__(self, registry, *, enabled: bool, warn, metrics: MetricsSink):
        self._registry, self._enabled = registry, enabled
        self._warn, self._metrics = warn, metrics
        self._error: str | None = None  # the last failure to read the engine's state
        self.engine = None

    async def read(self) -> tuple[set[int], set[int]]:
        """(slots, cached); empty (all "registered") if the engine cannot tell (logged once)."""
        if self.engine is None or not self._enabled:
            return set(), set()
        try:
            state = await self.engine.lora_state()
        except Exception as err:
            message = f"could not read the engine's adapter state: {err}"
            if message != self._error:
                self._warn(message)
            self._error = message
            return set(), set()
        self._error = None
        return state

    async def report(self) -> None:
        slots, cached = await self.read()
        self._metrics.record(AdapterStates(self._registry.state_counts(slots, cached)))

    async def report_forever(self, interval_s: float) -> None:
        while True:
            await self.report()
            await asyncio.sleep(interval_s)
