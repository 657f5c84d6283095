import json

import pytest

from lora_serving.errors import ConfigError
from lora_serving.settings import EngineSettings


def test_repository_model_json_files_load(tmp_path):
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2] / "model_repository"
    for model in ("whisper_lora", "qwen_vl_lora"):
        settings = EngineSettings.from_file(repo / model / "1" / "model.json")
        assert settings.lora_enabled
        assert settings.engine_args["max_loras"] >= 4
        assert settings.multi_lora_path.is_file()


def test_relative_model_path_is_resolved_against_model_json(tmp_path):
    (tmp_path / "weights").mkdir()
    (tmp_path / "1").mkdir()
    path = tmp_path / "1" / "model.json"
    path.write_text(json.dumps({"model": "../weights", "environment": {"X": 1}}))
    settings = EngineSettings.from_file(path)
    assert settings.engine_args["model"] == str((tmp_path / "weights").resolve())
    assert settings.environment == {"X": "1"}


def test_every_problem_is_listed(tmp_path):
    with pytest.raises(ConfigError) as err:
        EngineSettings.from_dict(
            {
                "max_lorax": 4,
                "serving": {"default_max_tokens": 0, "bogus": 1, "cancel_poll_s": 0},
            },
            model_dir=tmp_path,
        )
    text = str(err.value)
    assert "'model' (the base model folder) is required" in text
    assert "unknown vLLM engine argument(s) ['max_lorax']" in text
    assert "unknown 'serving' keys ['bogus']" in text
    assert "serving.cancel_poll_s must be in (0, 60] seconds, got 0" in text
