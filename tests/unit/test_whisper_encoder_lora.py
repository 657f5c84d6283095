"""Whisper encoder / cross-attention kv_proj LoRA plugin (defect 2): the parts that need no engine.

Routing goes through vLLM's own `LoRAModelManager._get_punica_wrapper`, and the Model Runner V2
ordering test drives vLLM's own `set_active_mm_loras` and `EncoderDecoderModelState` with
recording fakes for the runner internals (MRV2 needs Triton, which this CPU build lacks).
"""

import contextlib
import importlib
import logging
from types import SimpleNamespace

import pytest
import torch
import vllm.config
import vllm.version
from vllm.lora.layers import LoRAMappingType
from vllm.lora.model_manager import LoRAModelManager
from vllm.lora.request import LoRARequest
from vllm.model_executor.models import whisper
from vllm.platforms import current_platform
from vllm.v1.worker.gpu import model_runner as mrv2_runner
from vllm.v1.worker.gpu.lora_utils import LoraState
from vllm.v1.worker.gpu.mm import lora as mm_lora
from vllm.v1.worker.gpu.model_states.encoder_decoder import EncoderDecoderModelState

import lora_serving.vllm_plugin as plugin
from lora_serving.vllm_plugin import cpu_no_lora_index
from lora_serving.vllm_plugin import whisper_encoder_lora as encoder_lora

MODEL_CLS = whisper.WhisperForConditionalGeneration
FRAMES = 3  # encoder frames per audio in the fakes (1500 in real Whisper)


@pytest.fixture(autouse=True)
def restore_vllm():
    """Undo every binding the plugin may make, so each test starts from vLLM as installed."""
    saved_model_attrs = {
        name: MODEL_CLS.__dict__[name]
        for name in encoder_lora.PATCHED_ATTRIBUTES
        if name in MODEL_CLS.__dict__
    }
    saved_runner_hook = mrv2_runner.set_active_mm_loras
    ops_modules = [importlib.import_module(name) for name in cpu_no_lora_index.PATCHED_MODULES]
    saved_ops = {
        (module, name): getattr(module, name)
        for module in ops_modules
        for name in cpu_no_lora_index.FIXED_OPS
    }
    yield
    for name in encoder_lora.PATCHED_ATTRIBUTES:
        if name in saved_model_attrs:
            setattr(MODEL_CLS, name, saved_model_attrs[name])
        elif name in MODEL_CLS.__dict__:
            delattr(MODEL_CLS, name)
    mrv2_runner.set_active_mm_loras = saved_runner_hook
    for (module, name), op in saved_ops.items():
        setattr(module, name, op)


@pytest.fixture
def unpatched():
    """vLLM as installed, whatever earlier tests or imports applied."""
    for name in encoder_lora.PATCHED_ATTRIBUTES:
        if name in MODEL_CLS.__dict__:
            delattr(MODEL_CLS, name)
    mrv2_runner.set_active_mm_loras = mm_lora.set_active_mm_loras


# ---- which punica wrapper each Whisper module gets --------------------------------------------
def vllm_whisper_module_names(encoder_layers: int, decoder_layers: int) -> list[str]:
    """The LoRA-capable module names of vLLM's Whisper (packed qkv_proj / kv_proj)."""
    names = []
    for layer in range(encoder_layers):
        for module in ("self_attn.qkv_proj", "self_attn.out_proj", "mlp.fc1", "mlp.fc2"):
            names.append(f"model.encoder.layers.{layer}.{module}")
    for layer in range(decoder_layers):
        for module in (
            "self_attn.qkv_proj",
            "self_attn.out_proj",
            "encoder_attn.q_proj",
            "encoder_attn.kv_proj",
            "encoder_attn.out_proj",
            "mlp.fc1",
            "mlp.fc2",
        ):
            names.append(f"model.decoder.layers.{layer}.{module}")
    return names + ["proj_out"]


def wrapper_of(module_name: str, *, tower_registered: bool, decoder_layers: int) -> str | None:
    """vLLM's own choice of punica wrapper, over the prefixes `_maybe_init_mm` registers."""
    mapping = {encoder_lora.LANGUAGE_PREFIX: "language"}
    if tower_registered:  # only with enable_tower_connector_lora
        mapping |= {prefix: "tower" for prefix in encoder_lora.tower_prefixes(decoder_layers)}
    manager = SimpleNamespace(
        supports_mm=True, supported_modules_to_save=set(), punica_wrapper_mapping=mapping
    )
    return LoRAModelManager._get_punica_wrapper(manager, module_name)


def expected_wrapper(module_name: str) -> str | None:
    if module_name.startswith("model.encoder.") or module_name.endswith("encoder_attn.kv_proj"):
        return "tower"
    return "language" if module_name.startswith("model.decoder.") else None


@pytest.mark.parametrize("decoder_layers", [2, 12])  # 12: layers.1's prefix must not take 10, 11
def test_tower_flag_routes_encoder_and_cross_kv_to_tower_wrapper(decoder_layers):
    names = vllm_whisper_module_names(2, decoder_layers)
    routed = {
        name: wrapper_of(name, tower_registered=True, decoder_layers=decoder_layers)
        for name in names
    }
    assert routed == {name: expected_wrapper(name) for name in names}


def test_without_tower_flag_encoder_is_unwrapped_but_kv_proj_falls_on_decoder_mapping():
    """Why the plugin refuses that configuration at start-up (see check_engine_lora_config)."""
    routed = {
        name: wrapper_of(name, tower_registered=False, decoder_layers=2)
        for name in vllm_whisper_module_names(2, 2)
    }
    assert routed["model.encoder.layers.0.mlp.fc1"] is None  # vLLM logs "will be ignored"
    assert routed["model.decoder.layers.1.encoder_attn.kv_proj"] == "language"


def test_tower_prefixes():
    assert encoder_lora.tower_prefixes(2) == [
        "model.encoder.",
        "model.decoder.layers.0.encoder_attn.kv_proj",
        "model.decoder.layers.1.encoder_attn.kv_proj",
    ]


def fake_whisper(decoder_layers: int) -> SimpleNamespace:
    return SimpleNamespace(
        model=SimpleNamespace(decoder=SimpleNamespace(layers=[None] * decoder_layers))
    )


def test_get_mm_mapping_and_token_counts():
    mapping = encoder_lora.get_mm_mapping(fake_whisper(2))
    assert mapping.language_model == ["model.decoder."]
    assert mapping.tower_model == encoder_lora.tower_prefixes(2)
    assert mapping.connector == []
    counts = encoder_lora.get_mm_lora_token_counts(
        None, modality="audio", mm_kwargs=None, num_mm_embeds=1500
    )
    assert counts == (1500, None)


DECODER_ONLY_TARGETS = [
    f"model.decoder.layers.{layer}.{module}"
    for layer in range(2)
    for module in (
        "self_attn.qkv_proj",
        "self_attn.out_proj",
        "encoder_attn.q_proj",
        "encoder_attn.out_proj",
        "mlp.fc1",
        "mlp.fc2",
    )
]


@pytest.mark.parametrize(
    ("lora_config", "refused"),
    [
        (SimpleNamespace(enable_tower_connector_lora=False, target_modules=None), True),
        (SimpleNamespace(enable_tower_connector_lora=False, target_modules=["kv_proj"]), True),
        (SimpleNamespace(enable_tower_connector_lora=False, target_modules=["v_proj"]), True),
        (
            SimpleNamespace(enable_tower_connector_lora=False, target_modules=DECODER_ONLY_TARGETS),
            False,
        ),
        (SimpleNamespace(enable_tower_connector_lora=True, target_modules=None), False),
        (None, False),  # LoRA off
    ],
)
def test_engine_lora_config_check(monkeypatch, lora_config, refused):
    vllm_config = SimpleNamespace(lora_config=lora_config)
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: vllm_config)
    if refused:
        with pytest.raises(RuntimeError, match=r"enable_tower_connector_lora=True.*decoder"):
            encoder_lora.get_mm_mapping(fake_whisper(2))
    else:
        encoder_lora.get_mm_mapping(fake_whisper(2))


# ---- what the serving layer asks ----------------------------------------------------------
PEFT = "base_model.model."
ADAPTER_MODULES = {
    "decoder": [
        f"{PEFT}model.decoder.layers.0.self_attn.q_proj",
        f"{PEFT}model.decoder.layers.11.encoder_attn.out_proj",
        "model.decoder.layers.3.fc2",  # without PEFT's prefix
    ],
    "cross_kv": [
        f"{PEFT}model.decoder.layers.0.encoder_attn.k_proj",
        f"{PEFT}model.decoder.layers.5.encoder_attn.v_proj",
    ],
    "encoder": [
        f"{PEFT}model.encoder.layers.0.self_attn.v_proj",
        f"{PEFT}model.encoder.layers.31.fc1",
    ],
    "never": [
        f"{PEFT}proj_out",
        f"{PEFT}model.decoder.embed_tokens",
        f"{PEFT}model.encoder.conv1",
        f"{PEFT}model.encoder.layers.0.encoder_attn.k_proj",  # no such module
    ],
}


@pytest.mark.parametrize(
    ("enable_tower_connector_lora", "ignored_kinds"),
    [(True, ["never"]), (False, ["cross_kv", "encoder", "never"])],
)
def test_unapplied_adapter_modules(enable_tower_connector_lora, ignored_kinds):
    names = [name for names in ADAPTER_MODULES.values() for name in names]
    expected = sorted(name for kind in ignored_kinds for name in ADAPTER_MODULES[kind])
    unapplied = encoder_lora.unapplied_adapter_modules(
        names, enable_tower_connector_lora=enable_tower_connector_lora
    )
    assert unapplied == expected


def test_applicable_adapter_modules_lists_per_layer_patterns():
    with_tower = encoder_lora.applicable_adapter_modules(enable_tower_connector_lora=True)
    without = encoder_lora.applicable_adapter_modules(enable_tower_connector_lora=False)
    assert set(without) < set(with_tower)
    assert "model.decoder.layers.*.encoder_attn.k_proj" in set(with_tower) - set(without)
    assert "model.encoder.layers.*.self_attn.q_proj" in set(with_tower) - set(without)
    assert len(with_tower) == 8 + 2 + 6


@pytest.mark.parametrize(
    ("vllm_plugins", "supported"),
    [(None, True), ("lora_serving", True), ("other,lora_serving", True), ("", False), ("x", False)],
)
def test_encoder_lora_supported_follows_vllm_plugins(monkeypatch, vllm_plugins, supported):
    if vllm_plugins is None:
        monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("VLLM_PLUGINS", vllm_plugins)
    assert encoder_lora.encoder_lora_supported() is supported


def test_encoder_lora_not_supported_on_other_vllm(monkeypatch):
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setattr(vllm.version, "__version__", "0.33.0")
    assert encoder_lora.encoder_lora_supported() is False


# ---- register / apply -----------------------------------------------------------------------
def test_register_twice_patches_once_and_logs_once(unpatched, caplog, monkeypatch):
    monkeypatch.setattr(plugin.logger, "propagate", False)
    caplog.set_level(logging.INFO, logger=plugin.logger.name)
    plugin.logger.addHandler(caplog.handler)
    try:
        plugin.register()
        first = {name: MODEL_CLS.__dict__[name] for name in encoder_lora.PATCHED_ATTRIBUTES}
        plugin.register()
    finally:
        plugin.logger.removeHandler(caplog.handler)

    assert encoder_lora.is_applied()
    assert MODEL_CLS.supports_tower_connector_lora is True
    assert first == {name: MODEL_CLS.__dict__[name] for name in encoder_lora.PATCHED_ATTRIBUTES}
    lines = [r.getMessage() for r in caplog.records if "applied" in r.getMessage()]
    assert len(lines) == 1 and "whisper_encoder_lora" in lines[0], lines


def test_register_patches_whisper_on_every_platform(unpatched, monkeypatch):
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    plugin.register()
    assert encoder_lora.is_applied()
    assert not cpu_no_lora_index.is_applied()


def test_register_refuses_unsupported_vllm_before_patching(unpatched, monkeypatch):
    monkeypatch.setattr(vllm.version, "__version__", "0.33.0")
    with pytest.raises(RuntimeError, match=r"supports vLLM 0\.32\.x"):
        plugin.register()
    assert "get_mm_mapping" not in MODEL_CLS.__dict__
    assert mrv2_runner.set_active_mm_loras is mm_lora.set_active_mm_loras


def test_register_leaves_the_mrv2_runner_alone(unpatched):
    """Bound only when MRV2 asks Whisper for its model state (get_model_state_cls)."""
    plugin.register()
    assert mrv2_runner.set_active_mm_loras is mm_lora.set_active_mm_loras
    MODEL_CLS.get_model_state_cls()
    assert mrv2_runner.set_active_mm_loras is encoder_lora.set_active_mm_loras


@pytest.mark.parametrize(
    ("name", "replacement", "message"),
    [
        ("get_mm_mapping", lambda self: None, "get_mm_mapping is already defined"),
        ("get_model_state_cls", staticmethod(lambda: None), "get_model_state_cls is already"),
        ("packed_modules_mapping", {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}, "no kv_proj"),
    ],
)
def test_apply_refuses_a_whisper_it_was_not_written_for(
    unpatched, monkeypatch, name, replacement, message
):
    monkeypatch.setattr(MODEL_CLS, name, replacement, raising=False)
    with pytest.raises(RuntimeError, match=message):
        encoder_lora.apply()


def _changed_signature(model, lora_manager, encoder_cache, req_id_to_index, lora_state, extra):
    """Stands in for an upstream set_active_mm_loras whose interface changed."""


@pytest.mark.parametrize(
    ("target", "name", "replacement", "message"),
    [
        (mrv2_runner, "set_active_mm_loras", lambda **kwargs: None, "model_runner.set_active_mm"),
        (mm_lora, "set_active_mm_loras", _changed_signature, r"has signature \(.*extra\)"),
        (
            EncoderDecoderModelState,
            "prepare_inputs_embeds",
            lambda self, x: None,
            "not as expected",
        ),
    ],
)
def test_mrv2_state_refuses_a_runner_it_was_not_written_for(
    unpatched, monkeypatch, target, name, replacement, message
):
    encoder_lora.apply()
    monkeypatch.setattr(target, name, replacement)
    with pytest.raises(RuntimeError, match=message):
        MODEL_CLS.get_model_state_cls()


# ---- Model Runner V2: the tower mapping follows the encoder's order ---------------------------
class FakeWhisperModel:
    """What MRV2's tower-mapping code reads from the model."""

    def get_mm_lora_token_counts(self, *, modality, mm_kwargs, num_mm_embeds):
        return num_mm_embeds, None

    def get_mm_mapping(self):
        return SimpleNamespace(connector=[])


class RecordingLoRAManager:
    def __init__(self):
        self.tower_mappings = []

    def supports_tower_connector_lora(self) -> bool:
        return True

    def set_active_adapters(self, requests, mapping) -> None:
        assert mapping.type == LoRAMappingType.TOWER
        self.tower_mappings.append(mapping)


class RecordingEncoderRunner:
    """Stands in for EncoderRunner: records which request each encoded item belongs to."""

    def __init__(self):
        self.encoded_req_ids: list[str] = []

    def prepare_mm_inputs(self, encoder_inputs):
        items = [req_id for req_id, ids in encoder_inputs.items() for _ in ids]
        return items, [("audio", req_id) for req_id in items]

    def timed_encoder_operation(self, req_ids):
        return contextlib.nullcontext()

    def execute_mm_encoder(self, mm_kwargs):
        self.encoded_req_ids = [req_id for _, req_id in mm_kwargs]
        return [torch.zeros(FRAMES, 4) for _ in mm_kwargs]


def model_state(state_cls, model):
    """A real (sub)class of EncoderDecoderModelState over a minimal config, encoder recorded."""
    model_config = SimpleNamespace(
        enable_prompt_embeds=False,
        enforce_eager=True,
        dtype=torch.float32,
        get_inputs_embeds_size=lambda: 4,
        hf_config=SimpleNamespace(max_source_positions=FRAMES),
        max_model_len=16,
    )
    vllm_config = SimpleNamespace(
        model_config=model_config,
        scheduler_config=SimpleNamespace(max_num_seqs=8, max_num_batched_tokens=64),
        observability_config=None,
    )
    state = state_cls(vllm_config, model, SimpleNamespace(), torch.device("cpu"))
    state.encoder_runner = RecordingEncoderRunner()
    return state


# Scheduler order (dict order) vs the batch order MRV2 runs: it sorts by scheduled tokens, so
# the request with the shortest decoder prompt comes first.
SCHEDULED = {"long_prompt": [0], "short_prompt": [0], "mid_prompt": [0]}
BATCH_ORDER = ["short_prompt", "mid_prompt", "long_prompt"]
LORA_IDS = {"long_prompt": 1, "short_prompt": 0, "mid_prompt": 2}  # 0: no adapter


def run_encoder_step(state, model, set_active_mm_loras) -> tuple[list[int], list[int]]:
    """What MRV2's execute_model does in a step with encoder inputs; returns the TOWER mapping's
    adapter id per encoded item and the adapter ids of the items in the order they were encoded.
    """
    lora_state = LoraState(max_num_reqs=8)
    for index, req_id in enumerate(SCHEDULED):
        lora_id = LORA_IDS[req_id]
        request = LoRARequest(f"adapter{lora_id}", lora_id, "/unused") if lora_id else None
        lora_state.add_request(req_id, index, request)
    feature = SimpleNamespace(
        modality="audio", data=object(), mm_position=SimpleNamespace(get_num_embeds=lambda: FRAMES)
    )
    manager = RecordingLoRAManager()
    set_active_mm_loras(
        model=model,
        lora_manager=manager,
        encoder_cache=SimpleNamespace(mm_features={req_id: [feature] for req_id in SCHEDULED}),
        req_id_to_index={req_id: index for index, req_id in enumerate(SCHEDULED)},
        lora_state=lora_state,
        scheduled_encoder_inputs=SCHEDULED,
    )
    state.prepare_inputs_embeds(SCHEDULED, SimpleNamespace(req_ids=BATCH_ORDER), None)
    [tower] = manager.tower_mappings
    assert list(tower.index_mapping) == [i for i in tower.prompt_mapping for _ in range(FRAMES)]
    encoded = [LORA_IDS[req_id] for req_id in state.encoder_runner.encoded_req_ids]
    return list(tower.prompt_mapping), encoded


def test_mrv2_upstream_maps_tower_in_another_order_than_it_encodes():
    """The defect the MRV2 part of the plugin fixes, shown on vLLM's unpatched code."""
    model = FakeWhisperModel()
    state = model_state(EncoderDecoderModelState, model)
    tower, encoded = run_encoder_step(state, model, mm_lora.set_active_mm_loras)
    assert encoded == [0, 2, 1]  # batch order
    assert tower == [1, 0, 2]  # scheduler order: audio rows would get the wrong adapters


def test_mrv2_with_plugin_maps_tower_in_encoding_order():
    encoder_lora.apply()
    model = FakeWhisperModel()
    state = model_state(MODEL_CLS.get_model_state_cls(), model)
    assert isinstance(state, EncoderDecoderModelState)
    # The name MRV2's execute_model calls, now bound to the plugin's hook.
    tower, encoded = run_encoder_step(state, model, mrv2_runner.set_active_mm_loras)
    assert encoded == [0, 2, 1]
    assert tower == encoded


def test_mrv2_hook_leaves_other_models_to_vllm():
    encoder_lora.bind_mrv2_tower_hook()
    manager = RecordingLoRAManager()
    feature = SimpleNamespace(
        modality="image", data=object(), mm_position=SimpleNamespace(get_num_embeds=lambda: 2)
    )
    lora_state = LoraState(max_num_reqs=2)
    lora_state.add_request("r", 0, LoRARequest("a", 1, "/unused"))
    mrv2_runner.set_active_mm_loras(
        model=FakeWhisperModel(),  # no Whisper model state registered for it
        lora_manager=manager,
        encoder_cache=SimpleNamespace(mm_features={"r": [feature]}),
        req_id_to_index={"r": 0},
        lora_state=lora_state,
        scheduled_encoder_inputs={"r": [0]},
    )
    [tower] = manager.tower_mappings
    assert tower.index_mapping == (1, 1)
