"""A vLLM worker extension that tells which adapter ids sit in the engine's LoRA slots, how often
adapters were loaded (into a slot, and from disk into the adapter cache) and, for Whisper, how
often the encoder ran (vllm_plugin.whisper_encoder_memo).

vLLM's `list_loras` gives every adapter in the engine's cache (max_cpu_loras); the listing also
wants the ones in the max_loras slots a batch can use right now. vLLM injects this class into
its worker (engine argument `worker_extension_cls`), and `collective_rpc(SLOT_IDS_METHOD)` calls
it; our model hosts add the argument when LoRA is on and model.json names no other extension.
"""

EXTENSION = "lora_serving.engine.lora_slots.LoRASlotsExtension"
SLOT_IDS_METHOD = "lora_serving_slot_ids"
ENCODER_COUNTS_METHOD = "lora_serving_encoder_counts"
ADAPTER_LOADS_METHOD = "lora_serving_adapter_loads"
ALIGNMENT_METHOD = "lora_serving_take_alignment"
PIN_METHOD = "lora_serving_pin_in_cache"


class LoRASlotsExtension:
    def lora_serving_slot_ids(self) -> list[int]:
        """Adapter ids in the LoRA slots; [] if this vLLM's manager does not expose them."""
        worker_manager = getattr(self.model_runner, "lora_manager", None)
        manager = getattr(worker_manager, "_adapter_manager", None)
        slots = getattr(manager, "lora_index_to_id", None) or []
        return [int(lora_id) for lora_id in slots if lora_id is not None]

    def lora_serving_pin_in_cache(self, lora_id: int) -> None:
        """Pin an adapter in the max_cpu_loras cache only (adapters.pinning says why not in
        a batch slot, as vLLM's pin_lora also does); raises if it is not in the cache."""
        worker_manager = getattr(self.model_runner, "lora_manager", None)
        manager = getattr(worker_manager, "_adapter_manager", None)
        cache = getattr(manager, "_registered_adapters", None)
        if cache is None or not hasattr(cache, "pin"):
            raise RuntimeError("this vLLM's adapter cache cannot pin")
        cache.pin(lora_id)

    def lora_serving_adapter_loads(self) -> dict[str, int]:
        """Adapter loads counted since the first call (which starts the counting):
        `slot_loads`, an adapter moved into one of the max_loras slots a batch can use (vLLM's
        activate_adapter said it was not there); `cache_loads`, an adapter read from its
        folder into the max_cpu_loras cache. {} if this vLLM's managers are not the expected."""
        worker_manager = getattr(self.model_runner, "lora_manager", None)
        manager = getattr(worker_manager, "_adapter_manager", None)
        if manager is None or not hasattr(worker_manager, "_load_adapter"):
            return {}
        counts = getattr(worker_manager, "_lora_serving_loads", None)
        if counts is None:
            counts = {"slot_loads": 0, "cache_loads": 0}
            worker_manager._lora_serving_loads = counts
            activate, load = manager.activate_adapter, worker_manager._load_adapter

            def counted_activate(lora_id: int) -> bool:
                activated = activate(lora_id)
                counts["slot_loads"] += bool(activated)
                return activated

            def counted_load(lora_request):
                loaded = load(lora_request)
                counts["cache_loads"] += 1
                return loaded

            # Instance attributes: every self.activate_adapter / self._load_adapter call of
            # these two objects goes through them; the classes stay vLLM's.
            manager.activate_adapter = counted_activate
            worker_manager._load_adapter = counted_load
        return dict(counts)

    def lora_serving_encoder_counts(self) -> dict[str, int]:
        """Whisper encoder inputs and cross-attention K/V computed / reused
        (vllm_plugin.whisper_encoder_memo, whisper_cross_kv_memo)."""
        from lora_serving.vllm_plugin import whisper_cross_kv_memo
        from lora_serving.vllm_plugin.whisper_encoder_memo import encoder_counts

        cross = whisper_cross_kv_memo.memo_of(self.model_runner)
        counts = {"cross_kv_runs": 0, "cross_kv_reuses": 0}
        if cross is not None:
            counts.update(cross.counts())
        return {**encoder_counts(self.model_runner), **counts}

    def lora_serving_take_alignment(self, key: str) -> dict:
        """A Whisper word-timestamp alignment captured for the request flagged `key`
        (vllm_plugin.whisper_alignment), removed from the engine as it is taken."""
        from lora_serving.vllm_plugin import whisper_alignment

        return whisper_alignment.take(self.model_runner, key)
