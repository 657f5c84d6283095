"""Per-request Whisper LoRA on the encoder and on the cross-attention `encoder_attn.kv_proj`.

Defect (vLLM 0.32, "defect 2"): `WhisperForConditionalGeneration` is SupportsLoRA, but all its
LoRA layers share the decoder's punica wrapper, whose mapping holds one adapter index per
scheduled decoder token. The encoder layers and the cross-attention kv_proj run over 1500
encoder frames per audio, so with an adapter active the engine dies (einsum size mismatch), and
servers restrict LoRA to the decoder, serving whole-model adapters half-applied. Whisper's LoRA
support (vllm-project/vllm PR 29856) gave the encoder side no mapping of its own; we know of no
upstream fix.

Fix: reuse vLLM's tower/connector LoRA mechanism (built for Qwen-VL's vision tower; Ultravox
already runs a Whisper encoder as a LoRA tower) rather than a parallel one. The model class gets
`supports_tower_connector_lora`, `get_mm_mapping` (language model "model.decoder."; tower
"model.encoder." plus each decoder layer's "encoder_attn.kv_proj") and
`get_mm_lora_token_counts` (one tower row per encoder frame). vLLM then gives those layers their
own punica wrapper, and the model runner maps it per encoded audio, in the order the encoder
runs, before calling the encoder. kv_proj can share that wrapper because it runs in the same
step on exactly those rows: the concatenated encoder outputs of the audios encoded in that step,
in the same order; later steps read cross K/V from the KV cache and never call kv_proj. Only the
punica wrapper interface is used, so CPU and GPU run the same code. The engine must be started
with `enable_tower_connector_lora=True` (see `check_engine_lora_config`).

Model Runner V2 (the GPU default in 0.32) builds the tower mapping in `scheduled_encoder_inputs`
order but encodes in batch order (`EncoderDecoderModelState.prepare_inputs_embeds` reorders to
`input_batch.req_ids`, which MRV2 sorts by scheduled tokens), so encoder rows and kv_proj rows
could get another request's adapter. For Whisper, MRV2's call site is rebound (when MRV2 asks
the model for its state class) so that the tower mapping is built at the encoder step, in the
order the encoder actually runs (`WhisperModelStateV2`). The V1 runner (CPU, and GPU on
request) already maps in its encoder's order. MRV2 needs Triton, so that part is unit-tested
with vLLM's own MRV2 code but has not run in an engine here.

Serving: `encoder_lora_supported()`, `applicable_adapter_modules()` and
`unapplied_adapter_modules()` tell the server which adapter weights an engine will apply.
"""

import importlib
import inspect
import os
import re
import weakref
from collections.abc import Iterable
from typing import Any

WHISPER_MODULE = "vllm.model_executor.models.whisper"
WHISPER_CLASS = "WhisperForConditionalGeneration"
MRV2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"
MRV2_MM_LORA_MODULE = "vllm.v1.worker.gpu.mm.lora"
MRV2_ENCODER_DECODER_MODULE = "vllm.v1.worker.gpu.model_states.encoder_decoder"
# The vLLM plugin name (entry point in pyproject.toml) that VLLM_PLUGINS must allow.
PLUGIN_NAME = "lora_serving"

# Module-name prefixes of vLLM's Whisper (named_modules of WhisperForConditionalGeneration).
LANGUAGE_PREFIX = "model.decoder."
ENCODER_PREFIX = "model.encoder."
CROSS_KV_MODULE = "encoder_attn.kv_proj"

# Per-layer modules an adapter may carry, in Hugging Face / PEFT naming (what adapter files
# name; vLLM packs q/k/v into qkv_proj and the cross k/v into kv_proj).
DECODER_LAYER_MODULES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.out_proj",
    "encoder_attn.q_proj",
    "encoder_attn.out_proj",
    "fc1",
    "fc2",
)
CROSS_KV_LAYER_MODULES = ("encoder_attn.k_proj", "encoder_attn.v_proj")
ENCODER_LAYER_MODULES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.out_proj",
    "fc1",
    "fc2",
)
PEFT_PREFIX = "base_model.model."


# ---- pure helpers for the serving layer ---------------------------------------------------------
def applicable_adapter_modules(*, enable_tower_connector_lora: bool) -> tuple[str, ...]:
    """Adapter module names (PEFT naming, `*` = any layer index) whose LoRA weights an engine
    applies when this plugin is active and lora_target_modules is unset. Without
    enable_tower_connector_lora only decoder modules are applied (and such an engine must set
    lora_target_modules to decoder modules, see `check_engine_lora_config`)."""
    modules = [f"model.decoder.layers.*.{name}" for name in DECODER_LAYER_MODULES]
    if enable_tower_connector_lora:
        modules += [f"model.decoder.layers.*.{name}" for name in CROSS_KV_LAYER_MODULES]
        modules += [f"model.encoder.layers.*.{name}" for name in ENCODER_LAYER_MODULES]
    return tuple(modules)


def unapplied_adapter_modules(
    module_names: Iterable[str], *, enable_tower_connector_lora: bool
) -> list[str]:
    """The names among `module_names` (as in an adapter's weights, with or without PEFT's
    "base_model.model." prefix) that the engine would silently ignore; sorted."""
    patterns = applicable_adapter_modules(enable_tower_connector_lora=enable_tower_connector_lora)
    applied = re.compile("|".join(re.escape(p).replace(r"\*", r"\d+") for p in patterns))
    return sorted(
        name for name in set(module_names) if not applied.fullmatch(name.removeprefix(PEFT_PREFIX))
    )


def tower_prefixes(num_decoder_layers: int) -> list[str]:
    """Module prefixes that take the TOWER LoRA mapping: the encoder, and each decoder layer's
    cross-attention kv_proj (which runs on encoder rows, in the encoder step only)."""
    return [ENCODER_PREFIX] + [
        f"{LANGUAGE_PREFIX}layers.{layer}.{CROSS_KV_MODULE}" for layer in range(num_decoder_layers)
    ]


def encoder_lora_supported() -> bool:
    """Whether vLLM engines started from this process can take encoder / cross-kv LoRA.

    True when VLLM_PLUGINS lets vLLM load this plugin (unset = all plugins; read as vllm.envs
    does, but uncached) and the installed vLLM is one the patch fits. The engine still needs
    `enable_tower_connector_lora=True`.
    """
    from . import check_vllm_version, installed_vllm_version

    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        return False
    try:
        check_vllm_version(installed_vllm_version())
    except RuntimeError:
        return False
    return not _model_shape_problems()


# ---- what the plugin adds to WhisperForConditionalGeneration ------------------------------------
def get_mm_mapping(self):
    """Decoder on the language wrapper; encoder and cross-attention kv_proj on the tower wrapper."""
    from vllm.model_executor.models.module_mapping import MultiModelKeys

    num_decoder_layers = len(self.model.decoder.layers)
    check_engine_lora_config(num_decoder_layers)
    return MultiModelKeys.from_string_field(
        language_model=LANGUAGE_PREFIX, tower_model=tower_prefixes(num_decoder_layers)
    )


def get_mm_lora_token_counts(
    self, *, modality: str, mm_kwargs: Any, num_mm_embeds: int
) -> tuple[int, int | None]:
    """One tower row per encoder frame (the placeholder holds max_source_positions frames); no
    connector."""
    del modality, mm_kwargs
    return num_mm_embeds, None


def get_model_state_cls():
    """MRV2 asks the model for its state class (only MRV2 does): ours maps the tower in the
    encoder's order. MRV2's call site is rebound here, in the worker that runs MRV2, rather
    than in register(): other processes never import the GPU model runner for it."""
    bind_mrv2_tower_hook()
    return whisper_model_state_v2_cls()


PATCHED_ATTRIBUTES: dict[str, Any] = {
    "supports_tower_connector_lora": True,
    "get_mm_mapping": get_mm_mapping,
    "get_mm_lora_token_counts": get_mm_lora_token_counts,
    "get_model_state_cls": staticmethod(get_model_state_cls),
}


def check_engine_lora_config(num_decoder_layers: int) -> None:
    """Refuse, at LoRA start-up, an engine that would wrap kv_proj with the decoder's mapping.

    Without enable_tower_connector_lora vLLM registers no tower wrapper: encoder layers then get
    no LoRA wrapper (logged, their adapter weights are ignored), but "model.decoder." still
    claims every kv_proj, and the first adapter request would crash the engine as before. Such
    an engine must restrict lora_target_modules to decoder modules.
    """
    from vllm.config import get_current_vllm_config_or_none
    from vllm.lora.utils import is_in_target_modules

    vllm_config = get_current_vllm_config_or_none()
    lora_config = vllm_config.lora_config if vllm_config is not None else None
    if lora_config is None or lora_config.enable_tower_connector_lora:
        return
    cross_kv = [p for p in tower_prefixes(num_decoder_layers) if p.endswith(CROSS_KV_MODULE)]
    wrapped = [
        name
        for name in cross_kv
        if is_in_target_modules(name, lora_config.target_modules, {"kv_proj": ["k_proj", "v_proj"]})
    ]
    if wrapped:
        raise RuntimeError(
            "lora_serving: Whisper LoRA without enable_tower_connector_lora would put "
            f"{', '.join(wrapped)} on the decoder's LoRA mapping and crash on the first adapter "
            "request. Start the engine with enable_tower_connector_lora=True (encoder and "
            "cross-attention k/v LoRA), or set lora_target_modules to decoder modules only."
        )


# ---- Model Runner V2: tower mapping in the order the encoder runs -------------------------------
# model -> its WhisperModelStateV2; lets the runner hook find the state of the model it is given.
_STATE_BY_MODEL: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_state_cls = None


def whisper_model_state_v2_cls():
    """EncoderDecoderModelState that sets the TOWER LoRA mapping right before it encodes."""
    global _state_cls
    if _state_cls is not None:
        return _state_cls
    from vllm.v1.worker.gpu.mm import lora as mm_lora
    from vllm.v1.worker.gpu.model_states.encoder_decoder import EncoderDecoderModelState

    class WhisperModelStateV2(EncoderDecoderModelState):
        """Runs the deferred `set_active_mm_loras` with the encoder inputs in encoding order."""

        def __init__(self, vllm_config, model, encoder_cache, device):
            super().__init__(vllm_config, model, encoder_cache, device)
            self.pending_tower_lora_args: dict[str, Any] | None = None
            _STATE_BY_MODEL[model] = self

        def prepare_inputs_embeds(self, scheduled_encoder_inputs, input_batch, req_states):
            in_encoder_order = encoder_inputs_in_batch_order(
                scheduled_encoder_inputs, input_batch.req_ids
            )
            pending, self.pending_tower_lora_args = self.pending_tower_lora_args, None
            if pending is not None:
                mm_lora.set_active_mm_loras(**pending, scheduled_encoder_inputs=in_encoder_order)
            return super().prepare_inputs_embeds(in_encoder_order, input_batch, req_states)

    _state_cls = WhisperModelStateV2
    return _state_cls


def encoder_inputs_in_batch_order(
    scheduled_encoder_inputs: dict[str, list[int]], req_ids: list[str]
) -> dict[str, list[int]]:
    """The order EncoderDecoderModelState encodes in (and kv_proj sees rows in): batch order."""
    return {
        req_id: scheduled_encoder_inputs[req_id]
        for req_id in req_ids
        if scheduled_encoder_inputs.get(req_id)
    }


def set_active_mm_loras(
    model, lora_manager, encoder_cache, req_id_to_index, lora_state, scheduled_encoder_inputs
) -> None:
    """MRV2's call site, rebound: for Whisper, hand the call to its model state, which makes it
    with the inputs in encoding order; for any other model, vLLM's function unchanged."""
    arguments = dict(
        model=model,
        lora_manager=lora_manager,
        encoder_cache=encoder_cache,
        req_id_to_index=req_id_to_index,
        lora_state=lora_state,
    )
    state = _STATE_BY_MODEL.get(model)
    if state is not None:
        state.pending_tower_lora_args = arguments
        return
    mm_lora = importlib.import_module(MRV2_MM_LORA_MODULE)
    mm_lora.set_active_mm_loras(**arguments, scheduled_encoder_inputs=scheduled_encoder_inputs)


# ---- apply ------------------------------------------------------------------------------------
def _parameter_names(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def _model_shape_problems() -> list[str]:
    """What in vLLM's Whisper and LoRA code differs from what the patch was written against."""
    try:
        whisper = importlib.import_module(WHISPER_MODULE)
        interfaces = importlib.import_module("vllm.model_executor.models.interfaces")
        model_manager = importlib.import_module("vllm.lora.model_manager")
    except ImportError as error:
        return [f"cannot import a module the patch needs ({error})"]
    model_cls = getattr(whisper, WHISPER_CLASS, None)
    if model_cls is None:
        return [f"{WHISPER_MODULE}.{WHISPER_CLASS} is missing"]

    problems = []
    if not (interfaces.supports_lora(model_cls) and interfaces.supports_multimodal(model_cls)):
        problems.append(f"{WHISPER_CLASS} is no longer SupportsLoRA + SupportsMultiModal")
    if model_cls.packed_modules_mapping.get("kv_proj") != ["k_proj", "v_proj"]:
        problems.append(f"{WHISPER_CLASS}.packed_modules_mapping has no kv_proj = [k_proj, v_proj]")
    for name, value in PATCHED_ATTRIBUTES.items():
        current = model_cls.__dict__.get(name, value)
        if current is not value and name != "supports_tower_connector_lora":
            problems.append(f"{WHISPER_CLASS}.{name} is already defined (upstream fix?)")
    expected_counts = ["self", "modality", "mm_kwargs", "num_mm_embeds"]
    if _parameter_names(interfaces.SupportsMultiModal.get_mm_lora_token_counts) != expected_counts:
        problems.append("SupportsMultiModal.get_mm_lora_token_counts changed its signature")
    if not hasattr(model_manager.LoRAModelManager, "_maybe_init_mm"):
        problems.append("LoRAModelManager has no tower/connector set-up (_maybe_init_mm)")
    return problems


def _mrv2_shape_problems() -> list[str]:
    """What in Model Runner V2's tower-mapping code differs from what the hook expects."""
    try:
        runner = importlib.import_module(MRV2_RUNNER_MODULE)
        mm_lora = importlib.import_module(MRV2_MM_LORA_MODULE)
        encoder_decoder = importlib.import_module(MRV2_ENCODER_DECODER_MODULE)
    except ImportError as error:
        return [f"cannot import a module the MRV2 hook needs ({error})"]
    problems = []
    runner_hook = getattr(runner, "set_active_mm_loras", None)
    if runner_hook is not set_active_mm_loras and runner_hook is not mm_lora.set_active_mm_loras:
        problems.append(f"{MRV2_RUNNER_MODULE}.set_active_mm_loras is {runner_hook!r}")
    if _parameter_names(mm_lora.set_active_mm_loras) != _parameter_names(set_active_mm_loras):
        problems.append(
            f"{MRV2_MM_LORA_MODULE}.set_active_mm_loras has signature "
            f"{inspect.signature(mm_lora.set_active_mm_loras)}"
        )
    state_cls = getattr(encoder_decoder, "EncoderDecoderModelState", None)
    expected = ["self", "scheduled_encoder_inputs", "input_batch", "req_states"]
    if state_cls is None or _parameter_names(state_cls.prepare_inputs_embeds) != expected:
        problems.append("EncoderDecoderModelState.prepare_inputs_embeds is not as expected")
    return problems


def apply() -> bool:
    """Patch WhisperForConditionalGeneration; True if anything changed, False if already done.

    Raises RuntimeError, listing every mismatch, when the code to patch is not shaped as the
    fix expects (an upstream change, or someone else's patch).
    """
    problems = _model_shape_problems()
    if problems:
        raise RuntimeError(
            "lora_serving cannot apply its Whisper encoder LoRA fix to this vLLM: "
            + "; ".join(problems)
        )
    model_cls = getattr(importlib.import_module(WHISPER_MODULE), WHISPER_CLASS)
    changed = False
    for name, value in PATCHED_ATTRIBUTES.items():
        if model_cls.__dict__.get(name) is not value:
            setattr(model_cls, name, value)
            changed = True
    return changed


def bind_mrv2_tower_hook() -> None:
    """Rebind MRV2's `set_active_mm_loras` call site to ours (idempotent); RuntimeError, listing
    every mismatch, if MRV2's code is not shaped as the hook expects."""
    problems = _mrv2_shape_problems()
    if problems:
        raise RuntimeError(
            "lora_serving cannot order Whisper's tower LoRA mapping in vLLM's Model Runner V2: "
            + "; ".join(problems)
        )
    importlib.import_module(MRV2_RUNNER_MODULE).set_active_mm_loras = set_active_mm_loras


def is_applied() -> bool:
    model_cls = getattr(importlib.import_module(WHISPER_MODULE), WHISPER_CLASS)
    return all(model_cls.__dict__.get(name) is value for name, value in PATCHED_ATTRIBUTES.items())
