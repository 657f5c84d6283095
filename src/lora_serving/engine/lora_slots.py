"""A vLLM worker extension that tells which adapter ids sit in the engine's LoRA slots (and, for
Whisper, how often the encoder ran: vllm_plugin.whisper_encoder_memo).

vLLM's `list_loras` gives every adapter in the engine's cache (max_cpu_loras); the listing also
wants the ones in the max_loras slots a batch can use right now. vLLM injects this class into
its worker (engine argument `worker_extension_cls`), and `collective_rpc(SLOT_IDS_METHOD)` calls
it; our model hosts add the argument when LoRA is on and model.json names no other extension.
"""

EXTENSION = "lora_serving.engine.lora_slots.LoRASlotsExtension"
SLOT_IDS_METHOD = "lora_serving_slot_ids"
ENCODER_COUNTS_METHOD = "lora_serving_encoder_counts"


class LoRASlotsExtension:
    def lora_serving_slot_ids(self) -> list[int]:
        """Adapter ids in the LoRA slots; [] if this vLLM's manager does not expose them."""
        worker_manager = getattr(self.model_runner, "lora_manager", None)
        manager = getattr(worker_manager, "_adapter_manager", None)
        slots = getattr(manager, "lora_index_to_id", None) or []
        return [int(lora_id) for lora_id in slots if lora_id is not None]

    def lora_serving_encoder_counts(self) -> dict[str, int]:
        """Whisper encoder inputs computed / reused (vllm_plugin.whisper_encoder_memo)."""
        from lora_serving.vllm_plugin.whisper_encoder_memo import encoder_counts

        return encoder_counts(self.model_runner)
