"""vLLM general plugin: our fixes for vLLM LoRA defects that upstream has not merged yet, and a
few changes that are not defects. FIXES below is the list: one module per fix, the platforms it
applies on, what it does (docs/vllm-plugin.md explains each).

vLLM calls `register()` in every process it starts (entry point group `vllm.general_plugins`,
filtered by `VLLM_PLUGINS`), possibly more than once. vLLM logs and ignores a plugin that fails to
import but lets an exception from `register()` stop start-up, so this module imports nothing
heavy and `register()` raises instead of skipping a fix it cannot apply.
"""

import importlib
import logging
from dataclasses import dataclass

# The fixes are written against vLLM 0.32.x code; a new minor needs them re-checked (and may carry
# the upstream fixes: vllm-project/vllm PRs 48421, 49656).
SUPPORTED_VLLM_MINOR = (0, 32)

# A child of vLLM's "vllm" logger, so the line goes through vLLM's handler and is printed with
# the other start-up lines of each process (plain loggers here have no handler).
logger = logging.getLogger("vllm.plugins.lora_serving")


def installed_vllm_version() -> str:
    from vllm.version import __version__

    return __version__


def check_vllm_version(version: str) -> None:
    """Raise RuntimeError unless `version` is a vLLM release the fixes were written for."""
    from packaging.version import InvalidVersion, Version

    try:
        minor = Version(version).release[:2]
    except InvalidVersion:
        minor = None
    if minor != SUPPORTED_VLLM_MINOR:
        supported = ".".join(map(str, SUPPORTED_VLLM_MINOR))
        raise RuntimeError(
            f"lora_serving's vLLM plugin supports vLLM {supported}.x, found {version!r}. "
            "Re-check the patches in lora_serving/vllm_plugin against this vLLM (are upstream "
            "PRs 48421/49656 merged?) before changing SUPPORTED_VLLM_MINOR, or set VLLM_PLUGINS "
            "to leave this plugin out."
        )


@dataclass(frozen=True)
class Fix:
    module: str  # lora_serving.vllm_plugin.<module>, whose apply() returns whether it applied
    cpu_only: bool  # some check more inside apply() (AMX, VNNI, dtype); False: every platform
    does: str


# In the order they apply: whisper_cross_kv_memo wraps whisper_encoder_memo's wrapper.
FIXES = (
    Fix("cpu_no_lora_index", True, "vLLM defect: a request without an adapter gets zero delta"),
    Fix("cpu_int8_lora", True, "LoRA layers wrap int8 (W8A8) base layers"),
    Fix("cpu_int8_amx", True, "with AMX: int8 layers serve float32 models and 3-D inputs"),
    Fix("cpu_int8_no_vnni", True, "no VNNI: int8 layers run float GEMMs (oneDNN saturates)"),
    Fix("cpu_encoder_attention", True, "bf16/fp16 encoder attention in reduced-precision GEMMs"),
    Fix("cpu_no_spin", True, "vLLM's processes wait for messages asleep, not spinning a core"),
    Fix("whisper_encoder_lora", False, "vLLM defect: LoRA on Whisper's encoder and kv_proj"),
    Fix("whisper_decoder_prompt", False, "no extra <|startoftranscript|> before the prompt"),
    Fix("whisper_feature_padding", False, "a short window is padded with zero features"),
    Fix("whisper_encoder_memo", False, "the encoder runs once per audio window"),
    Fix("whisper_cross_kv_memo", False, "cross-attention K/V computed once per audio window"),
    Fix("tower_lora_per_modality", False, "vLLM defect: tower LoRA mapping per modality"),
    Fix("whisper_alignment", False, "word timestamps: the alignment heads' cross-attention"),
    Fix("die_with_parent", False, "an EngineCore or worker dies with the process that started it"),
)


def register() -> None:
    """Apply every fix the current platform needs; a no-op when they are already applied.

    One log line per process lists the fixes this call applied (none on a repeated call).
    """
    version = installed_vllm_version()
    check_vllm_version(version)

    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    applied = []
    for fix in FIXES:
        if fix.cpu_only and not on_cpu:
            continue
        if importlib.import_module(f"{__name__}.{fix.module}").apply():
            applied.append(f"{fix.module} ({fix.does})")
    if applied:
        logger.info("lora_serving plugin (vLLM %s): applied %s", version, "; ".join(applied))
