"""Which weights the engines load, for one run of the server: float (model.json's `model`) or
int8.

`LORA_SERVING_WEIGHTS` (what `make serve WEIGHTS=...`, i.e. `python -m lora_serving.launcher
--weights`, sets) is one of
- `float` (or unset): model.json's `model`;
- `int8`: model.json's `serving.int8_model`, the same model with int8 linear layers
  (lora_tools.demo.int8; vLLM runs them with int8 GEMMs and quantizes their inputs per token).
  A model without one keeps its float weights (the run's log says so).
Adapters are the same files either way: LoRA adds its product to the int8 layer's output.
Exactness checks against the float32 reference use float weights (the test suite's server does).
"""

from collections.abc import Mapping
from pathlib import Path

from lora_serving.errors import ConfigError

VARIABLE = "LORA_SERVING_WEIGHTS"
FLOAT, INT8 = "float", "int8"
CHOICES = (FLOAT, INT8)


def choice(environ: Mapping[str, str]) -> str:
    value = environ.get(VARIABLE, "").strip().lower() or FLOAT
    if value not in CHOICES:
        raise ConfigError(VARIABLE, [f"{value!r}: use one of {', '.join(CHOICES)}"])
    return value


def override(environ: Mapping[str, str], int8_model: Path | None) -> dict[str, str]:
    """Engine arguments that load the run's weights ({} for the configured float ones).

    The tokenizer stays model.json's (an int8 copy carries the same files)."""
    if choice(environ) != INT8 or int8_model is None:
        return {}
    if not (int8_model / "config.json").is_file():
        raise ConfigError(
            VARIABLE,
            [f"serving.int8_model {int8_model} holds no model (make setup builds the demo's)"],
        )
    return {"model": str(int8_model)}
