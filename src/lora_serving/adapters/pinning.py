"""Adapters kept in the engine's adapter cache: model.json `serving.adapters.pinned`.

vLLM keeps at most max_cpu_loras adapters in memory and evicts the least recently used one when
another comes in; an evicted adapter is read from its files again at its next request. A pinned
adapter is never evicted (vLLM's own LRU pin on that cache, called through our worker extension,
engine.lora_slots), so a hot tenant's next request after a long tail of others pays no reload.

Only the cache is pinned, not the max_loras batch slots (vLLM's `pin_lora` pins both): vLLM
0.32's scheduler puts up to max_loras adapters in a batch without counting pinned slots, so with
a slot pinned a batch of max_loras other adapters would evict one of its own mid-step. Moving a
cached adapter into a slot is a copy in memory.

At most max_cpu_loras - max_loras versions are pinned at once (settings checks the names against
it), so a batch's adapters always fit beside them. A replaced adapter's new version is pinned
when its old version has left the engine (the old one's removal unpins it).
"""

from collections.abc import Awaitable, Callable, Iterable

from lora_serving.adapters.catalog import Adapter

PinLora = Callable[[int], Awaitable[None]]


class PinnedAdapters:
    def __init__(self, names: Iterable[str], budget: int, warn: Callable[[str], None]):
        self.names = frozenset(names)
        self._budget = budget
        self._warn = warn
        self._ids: set[int] = set()  # versions pinned in the current engine
        self._failed: set[int] = set()  # versions the engine would not pin (warned once)

    def is_pinned(self, int_id: int) -> bool:
        return int_id in self._ids

    def reset(self) -> None:
        """A new engine holds no pins."""
        self._ids.clear()
        self._failed.clear()

    def forget(self, int_id: int) -> None:
        """The version left the engine (vLLM unpins what it removes)."""
        self._ids.discard(int_id)
        self._failed.discard(int_id)

    async def pin_wanted(self, serving: Iterable[Adapter], pin_lora: PinLora) -> None:
        """Pin every served version whose name is pinned, while the budget allows."""
        for adapter in serving:
            if adapter.name not in self.names or adapter.int_id in self._ids | self._failed:
                continue
            if len(self._ids) >= self._budget:
                return  # a replaced version still holds a pin: pinned after it leaves
            try:
                await pin_lora(adapter.int_id)
            except Exception as err:  # serving goes on unpinned; the listing shows it
                self._failed.add(adapter.int_id)
                self._warn(f"could not pin adapter '{adapter.name}': {err}")
                continue
            self._ids.add(adapter.int_id)
