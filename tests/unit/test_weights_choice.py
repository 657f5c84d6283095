"""The run's weights: model.json's float `model`, or its `serving.int8_model` (make serve
WEIGHTS=int8), and LoRA wrappers around vLLM's int8 layers (vllm_plugin.cpu_int8_lora)."""

import json

import pytest
import torch

from lora_serving import weights_choice
from lora_serving.errors import ConfigError
from lora_serving.settings import EngineSettings
from lora_serving.vllm_plugin import cpu_int8_lora


def settings_with_int8(tmp_path, int8_model: str | None) -> EngineSettings:
    model_dir = tmp_path / "repo" / "whisper_lora" / "1"
    model_dir.mkdir(parents=True)
    serving = {} if int8_model is None else {"int8_model": int8_model}
    data = {"model": "/models/whisper-base", "serving": serving}
    (model_dir / "model.json").write_text(json.dumps(data))
    return EngineSettings.from_file(model_dir / "model.json")


def test_int8_model_is_relative_to_model_json(tmp_path):
    settings = settings_with_int8(tmp_path, "../../../models/whisper-base-int8")
    assert settings.int8_model == tmp_path / "models" / "whisper-base-int8"
    assert settings_with_int8(tmp_path / "other", None).int8_model is None


def test_int8_loads_the_int8_model_and_float_keeps_model_json(tmp_path):
    settings = settings_with_int8(tmp_path, "../../../models/whisper-base-int8")
    int8_dir = settings.int8_model
    int8_dir.mkdir(parents=True)
    (int8_dir / "config.json").write_text("{}")
    assert weights_choice.override({}, int8_dir) == {}
    assert weights_choice.override({"LORA_SERVING_WEIGHTS": "float"}, int8_dir) == {}
    assert weights_choice.override({"LORA_SERVING_WEIGHTS": " INT8 "}, int8_dir) == {
        "model": str(int8_dir)
    }
    # A model without an int8 copy keeps its float weights.
    assert weights_choice.override({"LORA_SERVING_WEIGHTS": "int8"}, None) == {}


def test_bad_choices_and_missing_int8_models_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="'int4': use one of float, int8"):
        weights_choice.override({"LORA_SERVING_WEIGHTS": "int4"}, None)
    with pytest.raises(ConfigError, match="holds no model"):
        weights_choice.override({"LORA_SERVING_WEIGHTS": "int8"}, tmp_path / "absent")


class Int8Layer(torch.nn.Module):
    """What vLLM's CPU int8 kernel leaves: no weight, a per-row scale."""

    def __init__(self):
        super().__init__()
        self.weight = None
        self.weight_scale = torch.nn.Parameter(torch.ones(4, 1), requires_grad=False)


def test_lora_wrappers_find_an_int8_layers_device():
    from vllm.lora.layers import base_linear

    cpu_int8_lora.apply()
    assert not cpu_int8_lora.apply()  # applied once
    assert base_linear._get_lora_device is cpu_int8_lora.lora_device
    assert cpu_int8_lora.lora_device(Int8Layer()) == torch.device("cpu")
    assert cpu_int8_lora.lora_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    bare = torch.nn.Module()
    bare.weight = None
    assert cpu_int8_lora.lora_device(bare) == torch.device("cpu")
