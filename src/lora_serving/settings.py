"""`model.json` -> EngineSettings, read once when the model loads.

The file keeps Triton vllm_backend's shape (top-level keys are vLLM engine arguments) so its
model.json files work unchanged, plus two blocks of our own:
  "environment": {VAR: value} set in the model's process before the engine starts (CPU knobs
                 such as VLLM_CPU_KVCACHE_SPACE / VLLM_CPU_OMP_THREADS_BIND);
  "serving":     request-level limits and defaults (see ServingOptions).
Every problem is reported at once, naming the key.
"""

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lora_serving.errors import ConfigError


@dataclass(frozen=True)
class ServingOptions:
    default_max_tokens: int = 128
    max_tokens_limit: int | None = None  # None: the engine's max_model_len decides
    request_timeout_s: float = 600.0  # a request running longer ends with an error, not a hang
    max_items_per_request: int = 16  # batch rows in one Triton request
    max_payload_bytes: int = 64 * 1024 * 1024  # one encoded audio file / image / audio tensor
    multi_lora_file: str = "multi_lora.json"
    task: dict[str, Any] = field(default_factory=dict)  # task-specific options (audio, images)


_KNOWN_SERVING_KEYS = {f.name for f in dataclasses.fields(ServingOptions)}


@dataclass(frozen=True)
class EngineSettings:
    engine_args: dict[str, Any]
    environment: dict[str, str]
    serving: ServingOptions
    model_dir: Path  # the folder holding model.json (Triton's 1/)

    def with_engine_args(self, extra: dict[str, Any]) -> "EngineSettings":
        return dataclasses.replace(self, engine_args={**self.engine_args, **extra})

    @property
    def lora_enabled(self) -> bool:
        return bool(self.engine_args.get("enable_lora", False))

    @property
    def max_lora_rank(self) -> int:
        return int(self.engine_args.get("max_lora_rank", 16))

    @property
    def multi_lora_path(self) -> Path:
        return self.model_dir / self.serving.multi_lora_file

    @classmethod
    def from_file(cls, path: Path) -> "EngineSettings":
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigError(str(path), [f"cannot read: {err}"]) from err
        return cls.from_dict(data, model_dir=path.parent, source=str(path))

    @classmethod
    def from_dict(cls, data: dict, *, model_dir: Path, source: str = "model.json"):
        if not isinstance(data, dict):
            raise ConfigError(source, ["must be a JSON object"])
        data = dict(data)
        problems: list[str] = []
        environment = data.pop("environment", {}) or {}
        serving_raw = data.pop("serving", {}) or {}
        if not isinstance(environment, dict):
            problems.append("'environment' must be an object of strings")
            environment = {}
        environment = {str(k): str(v) for k, v in environment.items()}
        if not isinstance(serving_raw, dict):
            problems.append("'serving' must be an object")
            serving_raw = {}
        unknown_serving = sorted(set(serving_raw) - _KNOWN_SERVING_KEYS)
        if unknown_serving:
            problems.append(
                f"unknown 'serving' keys {unknown_serving} (allowed: {sorted(_KNOWN_SERVING_KEYS)})"
            )
        serving = ServingOptions(
            **{k: v for k, v in serving_raw.items() if k in _KNOWN_SERVING_KEYS}
        )
        if "model" not in data:
            problems.append("'model' (the base model folder) is required")
        else:
            data["model"] = _resolve_model_path(str(data["model"]), model_dir)
            data.setdefault("tokenizer", data["model"])
        problems.extend(_unknown_engine_args(data))
        if serving.default_max_tokens <= 0:
            problems.append("serving.default_max_tokens must be > 0")
        if data.get("enable_lora") and int(data.get("max_loras", 1)) < 1:
            problems.append("max_loras must be >= 1")
        if problems:
            raise ConfigError(source, problems)
        return cls(engine_args=data, environment=environment, serving=serving, model_dir=model_dir)


def _resolve_model_path(model: str, model_dir: Path) -> str:
    """Relative model paths are relative to model.json, so a repository can be moved whole."""
    candidate = Path(model)
    if not candidate.is_absolute() and (model_dir / candidate).exists():
        return str((model_dir / candidate).resolve())
    return model


def _unknown_engine_args(data: dict) -> list[str]:
    from vllm.engine.arg_utils import AsyncEngineArgs

    allowed = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    unknown = sorted(set(data) - allowed)
    return [f"unknown vLLM engine argument(s) {unknown}"] if unknown else []
