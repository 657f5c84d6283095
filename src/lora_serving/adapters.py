"""The adapters a model serves: `multi_lora.json` (Triton vllm_backend's {name: path}) -> catalog.

Each adapter is checked when the model loads (name, folder, PEFT config, rank, weight format,
modules the engine can apply) and a bad one is refused with every problem listed, so nothing is
discovered halfway through a request or silently half-applied.
"""

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from lora_serving.errors import ConfigError, InvalidRequest, UnknownAdapter

ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


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
    int_id: int  # stable: position in multi_lora.json + 1 (vLLM reserves 0)
    path: Path
    rank: int
    target_modules: tuple[str, ...]

    def to_lora_request(self):
        from vllm.lora.request import LoRARequest  # vLLM is heavy; import only when serving

        return LoRARequest(lora_name=self.name, lora_int_id=self.int_id, lora_path=str(self.path))


def _weight_module_names(weights: Path) -> set[str]:
    """Module paths that carry LoRA weights, read from the safetensors header (no tensor load)."""
    from safetensors import safe_open

    with safe_open(str(weights), framework="numpy") as handle:
        keys = list(handle.keys())
    return {re.sub(r"\.lora_[AB](\.[a-z_]+)?\.weight$", "", key) for key in keys if ".lora_" in key}


def load_adapter(
    name: str,
    path: Path,
    int_id: int,
    *,
    max_lora_rank: int,
    module_check: Callable[[set[str]], list[str]] | None = None,
) -> Adapter:
    """Check one adapter folder and describe it; ConfigError lists every problem found."""
    problems = []
    try:
        check_adapter_name(name)
    except InvalidRequest as err:
        problems.append(str(err))
    if not path.is_dir():
        raise ConfigError(f"adapter '{name}'", [f"folder {path} does not exist", *problems])
    config_path, weights = path / CONFIG_FILE, path / WEIGHTS_FILE
    if (path / "adapter_model.bin").exists() and not weights.exists():
        problems.append("only safetensors weights are loaded; adapter_model.bin (pickle) refused")
    elif not weights.is_file():
        problems.append(f"{WEIGHTS_FILE} is missing")
    rank, targets = 0, ()
    try:
        config = json.loads(config_path.read_text())
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
    if weights.is_file() and module_check is not None:
        problems.extend(module_check(_weight_module_names(weights)))
    if problems:
        raise ConfigError(f"adapter '{name}' ({path})", problems)
    return Adapter(name, int_id, path.resolve(), rank, targets)


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
        if not name:
            return None
        if not self.enabled:
            raise InvalidRequest(
                f"adapter '{name}' requested but LoRA is disabled for this model "
                "(set enable_lora in model.json)"
            )
        check_adapter_name(name)
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownAdapter(name, self.names) from None


def pick_adapter_name(*sources: tuple[str, str | None]) -> str | None:
    """The one adapter name a request gives, from (where, value) pairs; different values = error."""
    given = [(where, value) for where, value in sources if value]
    if len({value for _, value in given}) > 1:
        detail = ", ".join(f"{where}={value!r}" for where, value in given)
        raise InvalidRequest(f"conflicting adapter names: {detail}")
    return given[0][1] if given else None
