"""`model.json` -> EngineSettings, read once when the model loads.

The file keeps Triton vllm_backend's shape (top-level keys are vLLM engine arguments) so its
model.json files work unchanged, plus two blocks of our own:
  "environment": {VAR: value} set in the model's process before the engine starts (CPU knobs
                 such as VLLM_CPU_KVCACHE_SPACE / VLLM_CPU_OMP_THREADS_BIND);
  "serving":     request-level limits and defaults (see ServingOptions), with the adapter
                 fleet's options under "serving.adapters" (see AdapterOptions).
Every problem is reported at once, naming the key.
"""

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lora_serving.errors import ConfigError

CONTROL_LEVELS = ("off", "list", "full")
DEFAULT_MAX_LORAS = 4  # vLLM's default of 1 would serve one adapter per batch


@dataclass(frozen=True)
class AdapterOptions:
    """model.json `serving.adapters`: where adapters come from and who may change them."""

    # Folders whose subfolders are adapters named after them; relative to model.json.
    roots: tuple[Path, ...] = ()
    # Seconds between folder rescans (0: only on request). Rescans are cheap: one stat per file.
    rescan_interval_s: float = 30.0
    # adapter_command requests: "off", "list" (list + rescan) or "full" (+ load / unload).
    control: str = "list"
    # Names besides the served folder's own that adapters may give as base_model_name_or_path.
    base_model_names: tuple[str, ...] = ()
    # Where private copies of served adapters live (default: the system temp folder).
    snapshot_dir: Path | None = None
    # The environment variable holding the token that `load` / `unload` commands must carry
    # (request parameter `control_token`); None: no token, as before. Set but empty: no change
    # is accepted. The token itself never goes into model.json.
    control_token_env: str | None = None
    # Adapters kept in the engine's adapter cache (never evicted by others; adapters.pinning).
    pinned: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, raw: Any, *, model_dir: Path) -> tuple["AdapterOptions", list[str]]:
        """(options, problems); problems name the key as `serving.adapters.<key>`."""
        if not isinstance(raw, dict):
            return cls(), ["'serving.adapters' must be an object"]
        known = {f.name for f in dataclasses.fields(cls)}
        problems = [
            f"unknown 'serving.adapters' key '{key}' (allowed: {', '.join(sorted(known))})"
            for key in sorted(set(raw) - known)
        ]
        values: dict[str, Any] = {}
        for key in ("roots", "base_model_names", "pinned"):
            items = raw.get(key, [])
            if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
                problems.append(f"serving.adapters.{key} must be a list of non-empty strings")
                items = []
            values[key] = tuple(items)
        values["roots"] = tuple(_relative_to(model_dir, root) for root in values["roots"])
        interval = raw.get("rescan_interval_s", cls.rescan_interval_s)
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval < 0:
            problems.append(f"serving.adapters.rescan_interval_s must be >= 0, got {interval!r}")
        else:
            values["rescan_interval_s"] = float(interval)
        control = raw.get("control", cls.control)
        if control not in CONTROL_LEVELS:
            problems.append(
                f"serving.adapters.control must be one of {', '.join(CONTROL_LEVELS)}, "
                f"got {control!r}"
            )
        else:
            values["control"] = control
        token_env = raw.get("control_token_env")
        if token_env is not None and not (isinstance(token_env, str) and token_env.isidentifier()):
            problems.append(
                "serving.adapters.control_token_env must be an environment variable's name"
            )
        elif token_env:
            values["control_token_env"] = token_env
        snapshot_dir = raw.get("snapshot_dir")
        if snapshot_dir is not None and not (isinstance(snapshot_dir, str) and snapshot_dir):
            problems.append("serving.adapters.snapshot_dir must be a folder path")
        elif snapshot_dir:
            values["snapshot_dir"] = _relative_to(model_dir, snapshot_dir)
        return cls(**values), problems


def _relative_to(model_dir: Path, path: str) -> Path:
    candidate = Path(path)
    return candidate if candidate.is_absolute() else (model_dir / candidate).resolve()


@dataclass(frozen=True)
class ServingOptions:
    default_max_tokens: int = 128
    max_tokens_limit: int | None = None  # None: the engine's max_model_len decides
    request_timeout_s: float = 600.0  # a request running longer ends with an error, not a hang
    # How often a running request asks Triton whether its client cancelled it (each ask is an
    # IPC round trip to the server process).
    cancel_poll_s: float = 0.25
    # The engine died and the model cannot unload itself (model control "none"): stop the server
    # so its supervisor restarts it (lora_serving/engine/recovery.py).
    exit_on_engine_death: bool = True
    max_items_per_request: int = 16  # batch rows in one Triton request
    max_payload_bytes: int = 64 * 1024 * 1024  # one encoded audio file / image / audio tensor
    multi_lora_file: str = "multi_lora.json"
    # The same model with int8 linear layers, loaded when the run asks for int8 weights
    # (lora_serving.weights_choice); relative to model.json.
    int8_model: str | None = None
    task: dict[str, Any] = field(default_factory=dict)  # task-specific options (audio, images)
    adapters: AdapterOptions = field(default_factory=AdapterOptions)


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
    def max_loras(self) -> int:
        return int(self.engine_args.get("max_loras", DEFAULT_MAX_LORAS))

    @property
    def max_cpu_loras(self) -> int:
        """vLLM's default: as many as max_loras (its LRU cache of adapters held in memory)."""
        return int(self.engine_args.get("max_cpu_loras") or self.max_loras)

    @property
    def multi_lora_path(self) -> Path:
        return self.model_dir / self.serving.multi_lora_file

    @property
    def int8_model(self) -> Path | None:
        path = self.serving.int8_model
        return None if path is None else _relative_to(self.model_dir, path)

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
        adapter_options, adapter_problems = AdapterOptions.from_dict(
            serving_raw.get("adapters", {}), model_dir=model_dir
        )
        problems.extend(adapter_problems)
        serving = ServingOptions(
            **{k: v for k, v in serving_raw.items() if k in _KNOWN_SERVING_KEYS - {"adapters"}},
            adapters=adapter_options,
        )
        if "model" not in data:
            problems.append("'model' (the base model folder) is required")
        else:
            data["model"] = _resolve_model_path(str(data["model"]), model_dir)
            data.setdefault("tokenizer", data["model"])
        problems.extend(_unknown_engine_args(data))
        if serving.default_max_tokens <= 0:
            problems.append("serving.default_max_tokens must be > 0")
        poll_s = serving.cancel_poll_s
        if isinstance(poll_s, bool) or not isinstance(poll_s, int | float) or not 0 < poll_s <= 60:
            problems.append(f"serving.cancel_poll_s must be in (0, 60] seconds, got {poll_s!r}")
        if not isinstance(serving.exit_on_engine_death, bool):
            problems.append("serving.exit_on_engine_death must be true or false")
        if data.get("enable_lora"):
            data.setdefault("max_loras", DEFAULT_MAX_LORAS)
            problems.extend(_lora_limit_problems(data))
            if not problems:
                problems.extend(_pinned_problems(adapter_options.pinned, data))
        elif adapter_options.pinned:
            problems.append("serving.adapters.pinned needs enable_lora")
        data.setdefault("trust_remote_code", False)  # stays off unless model.json turns it on
        if problems:
            raise ConfigError(source, problems)
        return cls(engine_args=data, environment=environment, serving=serving, model_dir=model_dir)


def _lora_limit_problems(data: dict) -> list[str]:
    problems = []
    limits = {key: data.get(key) for key in ("max_loras", "max_cpu_loras", "max_lora_rank")}
    for key, value in limits.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            problems.append(f"{key} must be an integer, got {value!r}")
        elif value is not None and value < 1:
            problems.append(f"{key} must be >= 1, got {value}")
    max_loras, max_cpu_loras = limits["max_loras"], limits["max_cpu_loras"]
    if not problems and max_cpu_loras is not None and max_cpu_loras < max_loras:
        problems.append(
            f"max_cpu_loras ({max_cpu_loras}) must be >= max_loras ({max_loras}): the engine "
            "keeps every adapter of a batch in its cache"
        )
    return problems


def _pinned_problems(pinned: tuple[str, ...], data: dict) -> list[str]:
    """Pinned adapters must leave a batch's max_loras adapters room in the cache."""
    max_loras = data["max_loras"]
    max_cpu_loras = data.get("max_cpu_loras") or max_loras
    room = max_cpu_loras - max_loras
    if len(set(pinned)) > room:
        return [
            f"serving.adapters.pinned names {len(set(pinned))} adapter(s) but the engine's "
            f"cache (max_cpu_loras {max_cpu_loras}) can pin at most max_cpu_loras - max_loras "
            f"= {room}, so a batch's {max_loras} other adapters still fit: raise max_cpu_loras"
        ]
    return []


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
