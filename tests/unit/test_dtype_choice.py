"""The run's float type: model.json's, or LORA_SERVING_DTYPE's (make serve DTYPE=...)."""

import pytest

from lora_serving import dtype_choice
from lora_serving.errors import ConfigError

SAPPHIRE_RAPIDS = frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"})
SKYLAKE = frozenset({"avx2", "avx512f", "avx512bw"})


@pytest.mark.parametrize(
    "choice, on_cpu, flags, configured, expected",
    [
        ("float32", True, SAPPHIRE_RAPIDS, "bfloat16", "float32"),
        ("bfloat16", True, SKYLAKE, "float32", "bfloat16"),
        ("auto", True, SAPPHIRE_RAPIDS, "float32", "bfloat16"),
        ("auto", True, frozenset({"avx512_bf16"}), "float32", "bfloat16"),
        ("auto", True, SKYLAKE, "bfloat16", "float32"),  # emulated bf16 is slower
        ("auto", False, SKYLAKE, "bfloat16", "bfloat16"),  # a GPU keeps model.json's
        ("auto", False, SKYLAKE, None, "auto"),
    ],
)
def test_resolve(choice, on_cpu, flags, configured, expected):
    got = dtype_choice.resolve(choice, on_cpu=on_cpu, flags=flags, configured=configured)
    assert got == expected


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512_bf16 amx_bf16\n\nflags\t: other\n")
    assert dtype_choice.cpu_flags(cpuinfo) == {"fpu", "avx512_bf16", "amx_bf16"}
    assert dtype_choice.cpu_flags(tmp_path / "missing") == frozenset()


def test_override_only_when_the_run_sets_one():
    assert dtype_choice.override({}, "float32") == {}
    assert dtype_choice.override({"LORA_SERVING_DTYPE": " "}, "float32") == {}
    assert dtype_choice.override({"LORA_SERVING_DTYPE": "BFloat16"}, "float32") == {
        "dtype": "bfloat16"
    }
    with pytest.raises(ConfigError, match="LORA_SERVING_DTYPE='half': use one of"):
        dtype_choice.override({"LORA_SERVING_DTYPE": "half"}, "float32")
