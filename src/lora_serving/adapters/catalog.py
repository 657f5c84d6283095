"""The adapters a model serves: `multi_lora.json` (Triton vllm_backend's {name: path}) -> catalog.

Each adapter is checked when the model loads (name, folder, PEFT config, rank, weight format,
modules the engine can apply, and, given a base model, module shapes and base model name) and a
bad one is refused with every problem listed, so nothing is discovered halfway through a request
or silently half-applied. `adapters.fleet` uses the same checks for adapters added at runtime.
"""

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lora_serving.adapters.checks import max_tensor_rank
from lora_serving.errors import ConfigError, InvalidRequest, UnknownAdapter

ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
PICKLE_FILE = "adapter_model.bin"
PICKLE_REFUSED = f"only safetensors weights are loaded; {PICKLE_FILE} (pickle) refused"


def check_adapter_name(name: str) -> None:
    """Adapter names are plain identifiers: no paths, no control characters, at most 64 chars."""
    if not isinstance(name, str) or not ADAPTER_NAME.match(name) or ".." in name:
        shown = name if isinstance(name, str) and name.isprintable() else repr(name)
        raise InvalidRequest(
            f"invalid adapter name {shown[:80]!s}: use 1-64 letters, digits, '_', '-', '.', "
            "starting with a letter or digit"
        )


@dataclass(frozen=True)
class Adapter:
    name: str
    # Unique per loaded version, never reused (vLLM caches adapters by id; 0 is reserved).
    # multi_lora.json's adapters get 1..N in file order; later versions count on from there.
    int_id: int
    path: Path  # the folder the engine reads (for fleet adapters, a private snapshot)
    rank: int
    target_modules: tuple[str, ...]
    source: str = "multi_lora.json"  # multi_lora.json | root | control
    origin: Path | None = None  # the operator's folder when `path` is a snapshot of it
    version: int = 1  # 1, 2, ... per name: how often it has been (re)loaded

    @property
    def engine_name(self) -> str:
        """The name the engine sees: one per version, because vLLM keys its multimodal encoder
        cache by adapter name; a replaced adapter must not reuse the old version's encodings."""
        return f"{self.name}@{self.int_id}"

    def to_lora_request(self):
        from vllm.lora.request import LoRARequest  # vLLM is heavy; import only when serving

        return LoRARequest(
            lora_name=self.engine_name, lora_int_id=self.int_id, lora_path=str(self.path)
        )


def name_from_engine_name(engine_name: str) -> str:
    """Adapter.engine_name -> the adapter's name (for vLLM's per-adapter statistics)."""
    return engine_name.rsplit("@", 1)[0]


class BaseModelCheck(Protocol):
    """Does an adapter fit the served base model? (see adapters.checks.BaseModel)"""

    def problems(self, config: dict, shapes: dict[str, tuple[int, ...]]) -> list[str]: ...


def weight_shapes(weights: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, read from the safetensors header (no tensor load)."""
    from safetensors import safe_open

    with safe_open(str(weights), framework="numpy") as handle:
        return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}


def _module_names(shapes: dict[str, tuple[int, ...]]) -> set[str]:
    """Module paths that carry LoRA weights."""
    keys = [key for key in shapes if ".lora_" in key]
    return {re.sub(r"\.lora_[AB](\.[a-z_]+)?\.weight$", "", key) for key in keys}


def load_adapter(
    name: str,
    path: Path,
    int_id: int,
    *,
    max_lora_rank: int,
    module_check: Callable[[set[str]], list[str]] | None = None,
    base_model: BaseModelCheck | None = None,
    **described,
) -> Adapter:
    """Check one adapter folder and describe it; ConfigError lists every problem found.

    `described` fills Adapter's bookkeeping fields (source, origin, version).
    """
    problems = []
    try:
        check_adapter_name(name)
    except InvalidRequest as err:
        problems.append(str(err))
    if not path.is_dir():
        raise ConfigError(f"adapter '{name}'", [f"folder {path} does not exist", *problems])
    config_path, weights = path / CONFIG_FILE, path / WEIGHTS_FILE
    if (path / PICKLE_FILE).exists() and not weights.exists():
        problems.append(PICKLE_REFUSED)
    elif not weights.is_file():
        problems.append(f"{WEIGHTS_FILE} is missing")
    rank, targets, config = 0, (), None
    try:
        config = json.loads(config_path.read_text())
        if not isinstance(config, dict):
            raise TypeError("not a JSON object")
        rank = int(config.get("r", 0))
        raw_targets = config.get("target_modules") or []
        targets = (raw_targets,) if isinstance(raw_targets, str) else tuple(raw_targets)
        if config.get("peft_type", "LORA") != "LORA":
            problems.append(f"peft_type {config.get('peft_type')!r} is not LORA")
        if rank <= 0:
            problems.append(f"rank r={rank} must be > 0")
        elif rank > max_lora_rank:
            problems.append(f"rank {rank} exceeds max_lora_rank {max_lora_rank} (model.json)")
    except FileNotFoundError:
        problems.append(f"{CONFIG_FILE} is missing")
    except (json.JSONDecodeError, TypeError, ValueError) as err:
        problems.append(f"{CONFIG_FILE} is not a valid PEFT config: {err}")
        config = None
    shapes = None
    if weights.is_file():
        try:
            shapes = weight_shapes(weights)
        except Exception as err:  # safetensors raises its own error types for bad files
            problems.append(f"{WEIGHTS_FILE} is not a readable safetensors file: {err}")
    if shapes is not None and 0 < rank <= max_lora_rank < max_tensor_rank(shapes):
        problems.append(
            f"a module has rank {max_tensor_rank(shapes)} (rank_pattern), over max_lora_rank "
            f"{max_lora_rank} (model.json)"
        )
    if shapes is not None and module_check is not None:
        problems.extend(module_check(_module_names(shapes)))
    if shapes is not None and config is not None and base_model is not None:
        problems.extend(base_model.problems(config, shapes))
    if problems:
        raise ConfigError(f"adapter '{name}' ({described.get('origin') or path})", problems)
    return Adapter(name, int_id, path.resolve(), rank, targets, **described)


class AdapterCatalog:
    """Adapter name -> Adapter; resolves the name a request asks for."""

    def __init__(self, adapters: Iterable[Adapter], *, enabled: bool):
        self.enabled = enabled
        self._by_name = {adapter.name: adapter for adapter in adapters}

    @classmethod
    def from_multi_lora_json(
        cls,
        path: Path | None,
        *,
        enabled: bool,
        max_lora_rank: int,
        module_check: Callable[[set[str]], list[str]] | None = None,
    ) -> "AdapterCatalog":
        """Read vllm_backend's {name: folder}; relative folders are relative to the file."""
        if not enabled or path is None:
            return cls([], enabled=enabled)
        try:
            entries = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigError(str(path), [f"cannot read adapter list: {err}"]) from err
        if not isinstance(entries, dict):
            raise ConfigError(str(path), ['must be a JSON object {"adapter name": "folder"}'])
        adapters, problems = [], []
        for position, (name, folder) in enumerate(entries.items(), start=1):
            try:
                adapters.append(
                    load_adapter(
                        name,
                        (path.parent / str(folder)),
                        position,
                        max_lora_rank=max_lora_rank,
                        module_check=module_check,
                    )
                )
            except ConfigError as err:
                problems.append(str(err))
        if problems:
            raise ConfigError(str(path), problems)
        return cls(adapters, enabled=True)

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def __iter__(self):
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def resolve(self, name: str | None) -> Adapter | None:
        """None or "" means the base model; anything else must be a served adapter."""
        if not requested_adapter(name, lora_enabled=self.enabled):
            return None
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownAdapter(name, self.names) from None


def requested_adapter(name: str | None, *, lora_enabled: bool) -> str | None:
    """The adapter name a request asks for, checked; None (or "") means the base model."""
    if not name:
        return None
    if not lora_enabled:
        raise InvalidRequest(
            f"adapter '{name}' requested but LoRA is disabled for this model "
            "(set enable_lora in model.json)"
        )
    check_adapter_name(name)
    return name


def pick_adapter_name(*sources: tuple[str, str | None]) -> str | None:
    """The one adapter name a request gives, from (where, value) pairs; different values = error."""
    given = [(where, value) for where, value in sources if value]
    if len({value for _, value in given}) > 1:
        detail = ", ".join(f"{where}={value!r}" for where, value in given)
        raise InvalidRequest(f"conflicting adapter names: {detail}")
    return given[0][1] if given else None
