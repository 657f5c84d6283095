"""vLLM general plugin: our fixes for vLLM LoRA defects that upstream has not merged yet.

- cpu_no_lora_index (defect 1, CPU only): a request without an adapter gets zero LoRA delta.
- cpu_int8_lora (CPU only): LoRA layers wrap int8 (W8A8) base layers, whose weight vLLM's
  oneDNN kernel holds itself.
- cpu_int8_amx (CPU with AMX only): int8 layers serve float32 models, and (batch, seq, hidden)
  inputs, as they do without AMX.
- cpu_int8_no_vnni (x86 CPU without VNNI only): int8 layers give the right product (oneDNN's
  int8 GEMM saturates there); their weights are dequantized to the model's float type.
- cpu_encoder_attention (not a defect, CPU only): encoder attention at bf16/fp16 runs in
  bf16 GEMMs (PyTorch's CPU flash kernel computes it in float32 without AMX).
- cpu_no_spin (not a defect, CPU only): vLLM's processes wait for each other's messages asleep
  instead of spinning a core.
- whisper_encoder_lora (defect 2, every platform): Whisper takes per-request LoRA on its
  encoder and cross-attention kv_proj.
- whisper_decoder_prompt (every platform): Whisper's decoder prompt is not prefixed with an extra
  <|startoftranscript|>, so previous text reaches it in the form it was trained on.
- whisper_feature_padding (every platform): a window shorter than 30 s is padded with zero
  features after the audio, as openai-whisper's transcribe() and faster-whisper pad it.
- whisper_encoder_memo (every platform, V1 runner): Whisper's encoder runs once per audio window
  across the requests that decode it (probe, retries, beam steps).
- whisper_cross_kv_memo (every platform, V1 runner, eager mode): likewise each decoder layer's
  cross-attention keys and values.
- tower_lora_per_modality (every platform, V1 runner): a step that encodes images and videos
  together sets the tower/connector LoRA mapping per modality (vLLM's one mapping for all of the
  step's media killed the engine).
- die_with_parent (not a defect): an EngineCore or worker dies with the process that started it,
  so a crashed Triton stub leaves no engine behind.

vLLM calls `register()` in every process it starts (entry point group `vllm.general_plugins`,
filtered by `VLLM_PLUGINS`), possibly more than once. vLLM logs and ignores a plugin that fails to
import but lets an exception from `register()` stop start-up, so this module imports nothing
heavy and `register()` raises instead of skipping a fix it cannot apply.
"""

import logging

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


def register() -> None:
    """Apply every fix the current platform needs; a no-op when they are already applied.

    One log line per process lists the fixes this call applied (none on a repeated call).
    """
    version = installed_vllm_version()
    check_vllm_version(version)

    from vllm.platforms import current_platform

    applied = []
    if current_platform.is_cpu():
        from . import cpu_no_lora_index

        if cpu_no_lora_index.apply():
            applied.append(
                "cpu_no_lora_index (CPU LoRA ops give rows without an adapter, index -1, zero "
                "delta)"
            )
        from . import cpu_int8_lora

        if cpu_int8_lora.apply():
            applied.append("cpu_int8_lora (LoRA layers wrap int8 base layers)")
        from . import cpu_int8_amx

        if cpu_int8_amx.apply():
            applied.append(
                "cpu_int8_amx (int8 layers on AMX: float32 models on oneDNN, inputs of any rank)"
            )
        from . import cpu_int8_no_vnni

        if cpu_int8_no_vnni.apply():
            applied.append(
                "cpu_int8_no_vnni (no VNNI: int8 layers run float GEMMs over their dequantized "
                "weights; oneDNN's int8 GEMM saturates in int16 there)"
            )
        from . import cpu_encoder_attention

        if cpu_encoder_attention.apply():
            applied.append(
                "cpu_encoder_attention (encoder attention at bf16/fp16 in blocks of reduced-"
                "precision GEMMs, not PyTorch's float32-internal flash kernel)"
            )
        from . import cpu_no_spin

        if cpu_no_spin.apply():
            applied.append(
                f"cpu_no_spin (message-queue readers spin {cpu_no_spin.spin_seconds():g} s, "
                "then sleep until notified)"
            )

    from . import whisper_encoder_lora

    if whisper_encoder_lora.apply():
        applied.append(
            "whisper_encoder_lora (Whisper encoder and cross-attention kv_proj take per-request "
            "LoRA through the tower mapping; needs enable_tower_connector_lora=True)"
        )

    from . import whisper_decoder_prompt

    if whisper_decoder_prompt.apply():
        applied.append(
            "whisper_decoder_prompt (Whisper's decoder prompt is used as given: <|startofprev|> "
            "first, no extra <|startoftranscript|>)"
        )

    from . import whisper_feature_padding

    if whisper_feature_padding.apply():
        applied.append(
            "whisper_feature_padding (features after a short window's audio are zero, as "
            "openai-whisper pads them)"
        )

    from . import whisper_encoder_memo

    if whisper_encoder_memo.apply():
        applied.append(
            "whisper_encoder_memo (Whisper's encoder output is reused by the requests of one "
            "audio window)"
        )

    from . import whisper_cross_kv_memo  # after whisper_encoder_memo: it wraps that wrapper

    if whisper_cross_kv_memo.apply():
        applied.append(
            "whisper_cross_kv_memo (Whisper's cross-attention keys and values are reused by "
            "the requests of one audio window)"
        )

    from . import tower_lora_per_modality

    if tower_lora_per_modality.apply():
        applied.append(
            "tower_lora_per_modality (a step encoding images and videos sets the tower LoRA "
            "mapping per modality)"
        )

    from . import whisper_alignment

    if whisper_alignment.apply():
        applied.append(
            "whisper_alignment (word timestamps: the alignment heads' cross-attention of "
            "flagged requests)"
        )

    from . import die_with_parent

    if die_with_parent.apply():
        applied.append("die_with_parent (killed when the process that started it dies)")

    if applied:
        logger.info("lora_serving plugin (vLLM %s): applied %s", version, "; ".join(applied))
