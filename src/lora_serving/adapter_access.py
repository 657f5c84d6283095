"""What the tasks and the engine need of the served adapters, as two small Protocols.

AdapterCatalog (a fixed set, adapters/catalog.py) and AdapterFleet (a set that changes while
serving, adapters/fleet.py) both answer them; this module imports neither, so a task or the
engine depends on these few methods only.
"""

from contextlib import AbstractContextManager
from typing import Protocol

from lora_serving.adapters.catalog import Adapter


class AdapterResolver(Protocol):
    """Request decoding: an adapter name (None: the base model) -> the adapter to run."""

    @property
    def names(self) -> list[str]: ...

    def resolve(self, name: str | None) -> Adapter | None:
        """The adapter served under `name`; UnknownAdapter (naming the served ones) if none."""
        ...


class AdapterLeases(Protocol):
    """The engine host: hold the adapter version a job runs on for as long as it runs."""

    def lease(self, adapter: Adapter | None) -> AbstractContextManager[Adapter | None]:
        """Enter: the version to run (a replaced one gives way to its successor); UnknownAdapter
        if it was removed since the request was decoded."""
        ...
