"""A step that encodes images and videos together keeps per-request tower LoRA right.

vLLM 0.32's `GPUModelRunner._execute_mm_encoder` (which the CPU runner inherits) sets ONE
tower/connector LoRA mapping for every media item of the step (one adapter index per vision
token, over all items), then runs the encoder once per modality group. With both images and
videos in the step, each group's rows no longer match that mapping: the vision tower's LoRA
shrink fails (`RuntimeError: The expanded size of the tensor (144) must match the existing size
(312)`, seen with Qwen3-VL: 7 image and 7 video requests at once) and the engine dies. Any
client could kill it by sending an image while another sends a video, for every Qwen-VL
generation with `enable_tower_connector_lora`.

How: when tower LoRA is on and the step holds more than one modality, the encoder step runs once
per modality, each run seeing only that modality's items (`_batch_mm_inputs_from_scheduler`,
which already sorts the items by modality, is filtered), so each run sets the mapping for exactly
the rows it encodes. The outputs come back in the original order (modality order) and every
item is cached by its hash as before; steps with one modality run vLLM's code untouched.
"""

import importlib

from .wrapping import wrap_method

RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
RUNNER_CLASS = "GPUModelRunner"
_ORIGINAL: dict = {}
_ONLY_MODALITY = "_lora_serving_only_modality"


def _tower_lora_on(runner) -> bool:
    manager = getattr(runner, "lora_manager", None)
    return (
        bool(runner.lora_config)
        and manager is not None
        and (manager.supports_tower_connector_lora())
    )


def _batch_mm_inputs_from_scheduler(self, scheduler_output):
    hashes, kwargs, refs = _ORIGINAL["_batch_mm_inputs_from_scheduler"](self, scheduler_output)
    only = getattr(self, _ONLY_MODALITY, None)
    if only is None:
        return hashes, kwargs, refs
    keep = [index for index, (modality, _) in enumerate(kwargs) if modality == only]
    return (
        [hashes[index] for index in keep],
        [kwargs[index] for index in keep],
        [refs[index] for index in keep],
    )


def _execute_mm_encoder(self, scheduler_output, *args, **kwargs):
    original = _ORIGINAL["_execute_mm_encoder"]
    if getattr(self, _ONLY_MODALITY, None) is not None or not _tower_lora_on(self):
        return original(self, scheduler_output, *args, **kwargs)
    _, items, _ = self._batch_mm_inputs_from_scheduler(scheduler_output)
    modalities = list(dict.fromkeys(modality for modality, _ in items))
    if len(modalities) <= 1:
        return original(self, scheduler_output, *args, **kwargs)
    outputs = []
    for modality in modalities:
        setattr(self, _ONLY_MODALITY, modality)
        try:
            outputs.extend(original(self, scheduler_output, *args, **kwargs))
        finally:
            setattr(self, _ONLY_MODALITY, None)
    return outputs


def apply() -> bool:
    """Wrap the V1 runner's encoder step and its item batching; True if this call changed it."""
    runner_cls = getattr(importlib.import_module(RUNNER_MODULE), RUNNER_CLASS)
    changed = wrap_method(
        runner_cls, "_batch_mm_inputs_from_scheduler", _batch_mm_inputs_from_scheduler, _ORIGINAL
    )
    return wrap_method(runner_cls, "_execute_mm_encoder", _execute_mm_encoder, _ORIGINAL) or (
        changed
    )
