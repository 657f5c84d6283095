"""The worker extension's adapter-load counting (lora_serving.engine.lora_slots) over objects
shaped as vLLM 0.32's LRU managers: counting starts at the first call, a slot load is an
activate_adapter that moved an adapter in, a cache load is one _load_adapter."""

from types import SimpleNamespace

from lora_serving.engine.lora_slots import LoRASlotsExtension


class ModelManager:  # vLLM's LRUCacheLoRAModelManager, as far as the counting sees it
    def __init__(self, slots: int):
        self.slots, self.active = slots, []

    def activate_adapter(self, lora_id: int) -> bool:
        if lora_id in self.active:  # touched: least recently used goes first
            self.active.remove(lora_id)
            self.active.append(lora_id)
            return False
        if len(self.active) >= self.slots:
            self.active.pop(0)
        self.active.append(lora_id)
        return True


class WorkerManager:  # LRUCacheWorkerLoRAManager: loads from disk, then activates
    def __init__(self, slots: int):
        self._adapter_manager = ModelManager(slots)

    def _load_adapter(self, request):
        return SimpleNamespace(id=request)

    def add_adapter(self, request) -> None:
        self._adapter_manager.activate_adapter(self._load_adapter(request).id)


def worker(slots: int = 2) -> LoRASlotsExtension:
    extension = LoRASlotsExtension()
    extension.model_runner = SimpleNamespace(lora_manager=WorkerManager(slots))
    return extension


def test_adapter_loads_are_counted_from_the_first_call():
    ext = worker(slots=2)
    manager = ext.model_runner.lora_manager
    manager.add_adapter(1)  # before counting started: not counted
    assert ext.lora_serving_adapter_loads() == {"slot_loads": 0, "cache_loads": 0}
    manager.add_adapter(2)  # read from disk, into the free slot
    for lora_id in (1, 2, 1, 3, 1):  # 3 evicts 2 (least recent), 1 stays in
        manager._adapter_manager.activate_adapter(lora_id)
    assert ext.lora_serving_adapter_loads() == {"slot_loads": 2, "cache_loads": 1}
    assert ext.lora_serving_adapter_loads() == {"slot_loads": 2, "cache_loads": 1}  # idempotent


def test_no_lora_manager_means_no_counts():
    ext = LoRASlotsExtension()
    ext.model_runner = SimpleNamespace(lora_manager=None)
    assert ext.lora_serving_adapter_loads() == {}
