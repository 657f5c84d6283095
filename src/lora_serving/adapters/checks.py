"""Does an adapter fit the served base model? Its declared base model name and its weight shapes.

vLLM checks an adapter's rank and module names, not its shapes against the model: a smaller
tensor is copied into a corner of the engine's LoRA buffers without complaint, so an adapter
trained for another model of the same family would be served silently wrong. Shapes come from
the safetensors headers on both sides; no weights are loaded.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path

# PEFT's tensor names: <module>.lora_A[.<adapter name>].weight, or lora_embedding_A (no .weight).
_LORA_KEY = re.compile(
    r"^(?P<module>.+)\.lora_(?P<kind>embedding_)?(?P<ab>[AB])(\.[\w-]+)?(\.weight)?$"
)
# transformers 4 and 5 name the same Qwen-VL weights model.layers.* / model.language_model.layers.*
# and visual.* / model.visual.*; PEFT prefixes base_model.model. Dropping these wrapper
# components makes adapter and checkpoint names comparable.
_WRAPPERS = frozenset({"model", "language_model"})
_SHOWN = 4


def canonical_module(path: str) -> str:
    parts = path.split(".")
    if parts[:2] == ["base_model", "model"]:
        parts = parts[2:]
    return ".".join(part for part in parts if part not in _WRAPPERS)


def _last_component(name: str) -> str:
    return Path(name.rstrip("/")).name.lower()


def _checkpoint_shapes(folder: Path) -> dict[str, tuple[int, ...] | None]:
    """Canonical module -> its 2-D weight's shape, over every safetensors file of the model.

    A name two weights share after canonicalisation maps to None (ambiguous: not checked).
    """
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...] | None] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="numpy") as handle:
            for key in handle.keys():
                if not key.endswith(".weight"):
                    continue
                shape = tuple(handle.get_slice(key).get_shape())
                if len(shape) != 2:
                    continue
                module = canonical_module(key.removesuffix(".weight"))
                shapes[module] = shape if shapes.get(module, shape) == shape else None
    return shapes


@dataclass(frozen=True)
class BaseModel:
    """The served base model as adapters are checked against it."""

    folder: Path
    accepted_names: frozenset[str]  # last path components, lower case
    weight_shapes: dict[str, tuple[int, ...] | None]

    @classmethod
    def from_folder(cls, folder: Path, extra_names: tuple[str, ...] = ()) -> "BaseModel":
        """Accepted names: the folder's own, config.json's _name_or_path, and `extra_names`."""
        folder = Path(folder).resolve()
        names = {folder.name, *extra_names}
        try:
            declared = json.loads((folder / "config.json").read_text()).get("_name_or_path")
        except (OSError, ValueError, AttributeError):
            declared = None
        if isinstance(declared, str) and declared:
            names.add(declared)
        return cls(folder, frozenset(_last_component(n) for n in names), _checkpoint_shapes(folder))

    def problems(self, config: dict, shapes: dict[str, tuple[int, ...]]) -> list[str]:
        return self._name_problems(config) + self._shape_problems(config, shapes)

    def _name_problems(self, config: dict) -> list[str]:
        declared = config.get("base_model_name_or_path")
        if not isinstance(declared, str) or not declared:
            return []  # nothing declared: the shapes decide
        if _last_component(declared) in self.accepted_names:
            return []
        if Path(declared).is_dir() and Path(declared).resolve() == self.folder:
            return []
        return [
            f"trained for base model '{declared}', but this model serves '{self.folder.name}' "
            f"(accepted names: {', '.join(sorted(self.accepted_names))}; if it is the same "
            "model, add its name to serving.adapters.base_model_names in model.json)"
        ]

    def _shape_problems(self, config: dict, shapes: dict[str, tuple[int, ...]]) -> list[str]:
        if not self.weight_shapes:
            return []  # no safetensors checkpoint to compare with
        pairs: dict[str, dict[str, tuple[int, ...]]] = {}
        for key, shape in shapes.items():
            match = _LORA_KEY.match(key)
            if match and len(shape) == 2:
                kind = ("embedding_" if match["kind"] else "") + match["ab"]
                pairs.setdefault(match["module"], {})[kind] = shape
        missing, wrong = [], []
        transposed = bool(config.get("fan_in_fan_out"))
        for module, tensors in sorted(pairs.items()):
            canonical = canonical_module(module)
            if canonical not in self.weight_shapes:
                missing.append(module.removeprefix("base_model.model."))
                continue
            base = self.weight_shapes[canonical]
            if base is None:
                continue
            problem = _pair_problem(tensors, base, transposed)
            if problem:
                wrong.append(f"{module.removeprefix('base_model.model.')}: {problem}")
        problems = []
        if missing:
            problems.append(
                f"{len(missing)} module(s) do not exist in base model '{self.folder.name}': "
                + _first(missing)
            )
        if wrong:
            problems.append(
                f"{len(wrong)} module(s) do not fit base model '{self.folder.name}': "
                + _first(wrong)
            )
        return problems


def _pair_problem(tensors: dict, base: tuple[int, ...], transposed: bool) -> str | None:
    """Linear: A [r, in], B [out, r] against W [out, in]; embedding: A [r, vocab], B [dim, r]."""
    embedding = "embedding_A" in tensors or "embedding_B" in tensors
    a = tensors.get("embedding_A" if embedding else "A")
    b = tensors.get("embedding_B" if embedding else "B")
    if a is None or b is None:
        return "lora_A or lora_B is missing"
    if embedding:
        expected_in, expected_out = base
    else:
        expected_out, expected_in = reversed(base) if transposed else base
    if a[1] != expected_in or b[0] != expected_out or a[0] != b[1]:
        return f"lora_A {list(a)} / lora_B {list(b)} vs base weight {list(base)}"
    return None


def _first(items: list[str]) -> str:
    shown = ", ".join(items[:_SHOWN])
    return shown + (f" (+{len(items) - _SHOWN} more)" if len(items) > _SHOWN else "")


def max_tensor_rank(shapes: dict[str, tuple[int, ...]]) -> int:
    """The largest rank among the adapter's lora_A tensors (rank_pattern can exceed `r`)."""
    ranks = [
        shape[0]
        for key, shape in shapes.items()
        if (match := _LORA_KEY.match(key)) and match["ab"] == "A" and len(shape) == 2
    ]
    return max(ranks, default=0)
