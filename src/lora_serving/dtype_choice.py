"""The float type the engines compute in, for one run of the server.

model.json's `dtype` is what a model is configured with. An operator can set it for every model
of a run without editing model.json: `LORA_SERVING_DTYPE` (what `make serve DTYPE=...`, i.e.
`python -m lora_serving.launcher --dtype`, sets) is one of
- `float32`, `bfloat16`: that type;
- `auto`: on a CPU, bfloat16 where the CPU has native bf16 arithmetic (AMX or AVX-512 BF16,
  which vLLM's CPU backend uses through oneDNN), else float32 (bf16 emulated in software is
  slower than float32); on a GPU, model.json's own `dtype`.
Unset or empty: model.json's `dtype`. Exactness checks against the float32 reference pin
`float32` (the test suite's server does).
"""

from collections.abc import Mapping
from pathlib import Path

from lora_serving.errors import ConfigError

VARIABLE = "LORA_SERVING_DTYPE"
CHOICES = ("float32", "bfloat16", "auto")
BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


CPUINFO = Path("/proc/cpuinfo")


def cpuinfo_field(name: str, cpuinfo: Path = CPUINFO) -> str:
    """The first processor's `name` line in /proc/cpuinfo ("" where there is none)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return ""


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first processor's feature flags (empty where /proc/cpuinfo has none)."""
    return frozenset(cpuinfo_field("flags", cpuinfo).split())


def resolve(choice: str, *, on_cpu: bool, flags: frozenset[str], configured: str | None) -> str:
    """The dtype an engine gets for an operator's `choice` (see the module text)."""
    if choice not in CHOICES:
        raise ValueError(f"{VARIABLE}={choice!r}: use one of {', '.join(CHOICES)}")
    if choice != "auto":
        return choice
    if not on_cpu:
        return configured or "auto"  # vLLM's own "auto": the checkpoint's type
    return "bfloat16" if flags & BF16_CPU_FLAGS else "float32"


def override(environ: Mapping[str, str], configured: str | None) -> dict[str, str]:
    """Engine arguments that apply the run's choice ({} when there is none)."""
    choice = environ.get(VARIABLE, "").strip().lower()
    if not choice:
        return {}
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    try:
        dtype = resolve(choice, on_cpu=on_cpu, flags=cpu_flags(), configured=configured)
    except ValueError as err:
        raise ConfigError(VARIABLE, [str(err)]) from None
    return {"dtype": dtype}
