"""Whisper speech-to-text: audio (samples or a file) + options -> one TranscriptionJob per row.

A request's path through the Whisper task, file by file:
- whisper_request.py: a batch row -> TranscriptionJob (audio decoded, options checked, the
  language resolved when given);
- whisper_job.py: `TranscriptionJob.run(engine)`: VAD, language detection, then
- whisper_decoding.py: the windows' prompts, decoding attempts (quality fallback, beam search,
  no-speech probe) and their stitching (whisper_windows), word timings (whisper_word_timing);
  each engine request goes through the job's EngineSession (engine/engine_session.py);
- this module's `render`: the job's chunks -> text_output, language, segments and vllm_backend's
  additional outputs.
What the served model contributes (tokenizer, special tokens, languages, limits) is read once,
at load, into whisper_model.WhisperModel.
"""

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from lora_serving.adapter_access import AdapterResolver
from lora_serving.jobs import GenerationChunk, RequestPlan
from lora_serving.request_inputs import RawRequest
from lora_serving.settings import EngineSettings
from lora_serving.tasks import additional_outputs, whisper_options, whisper_tokenizer_check
from lora_serving.tasks.base import RowReader
from lora_serving.tasks.whisper_decoding import first_request
from lora_serving.tasks.whisper_job import TranscriptionJob
from lora_serving.tasks.whisper_logits import PROCESSOR
from lora_serving.tasks.whisper_model import WhisperModel
from lora_serving.tasks.whisper_request import TranscriptionRequestReader
from lora_serving.vllm_plugin.whisper_encoder_lora import (
    encoder_lora_supported,
    unapplied_adapter_modules,
)

# vLLM's (packed) module names in each decoder layer that take LoRA.
DECODER_LORA_MODULES = (
    "self_attn.qkv_proj",
    "self_attn.out_proj",
    "encoder_attn.q_proj",
    "encoder_attn.out_proj",
    "mlp.fc1",
    "mlp.fc2",
)


class TranscriptionTask:
    output_names = ("text_output", "language", "segments", *additional_outputs.NAMES)

    def __init__(self, settings: EngineSettings, adapters: AdapterResolver, tokenizer):
        # A tokenizer that encodes otherwise than openai-whisper's refuses the model.
        whisper_tokenizer_check.check(tokenizer, settings.engine_args["model"])
        self.tokenizer = tokenizer
        self.model = WhisperModel(settings, tokenizer)
        vocab_size = len(tokenizer)
        self.reader = RowReader(
            settings,
            adapters,
            max_tokens_limit=settings.serving.max_tokens_limit or self.model.max_model_len - 8,
            sampling_defaults={
                "temperature": 0.0,
                "max_tokens": settings.serving.default_max_tokens,
                **whisper_options.decoding_defaults(
                    settings.serving.task, vocab_size, source="model.json"
                ),
            },
            task_fields=whisper_options.task_fields(vocab_size),
        )
        self.requests = TranscriptionRequestReader(settings, self.model, self.reader)

    @staticmethod
    def engine_overrides(settings: EngineSettings) -> dict[str, Any]:
        """Load the timestamp rules into the engine; choose which layers take LoRA.

        With our plugin and enable_tower_connector_lora, every layer takes per-request LoRA
        (encoder and cross-attention k/v through vLLM's tower mapping). Otherwise LoRA wrappers
        are restricted to the decoder: vLLM 0.32 would wrap the encoder too and apply a
        decoder-token mapping to its 1500 frames per audio, killing the engine.
        """
        processors = list(settings.engine_args.get("logits_processors") or [])
        if PROCESSOR not in processors:
            processors.append(PROCESSOR)
        overrides: dict[str, Any] = {
            "logits_processors": processors,
            # Log-probabilities after Whisper's decoding rules (whisper_quality's average).
            "logprobs_mode": settings.engine_args.get("logprobs_mode", "processed_logprobs"),
            # -1: every token's, which a sampled retry needs (whisper_quality.at_temperature_one).
            "max_logprobs": settings.engine_args.get("max_logprobs", -1),
        }
        if (
            not settings.lora_enabled
            or "lora_target_modules" in settings.engine_args
            or _encoder_lora_enabled(settings)
        ):
            return overrides
        config = json.loads((Path(settings.engine_args["model"]) / "config.json").read_text())
        overrides["lora_target_modules"] = [
            f"model.decoder.layers.{layer}.{module}"
            for layer in range(int(config["decoder_layers"]))
            for module in DECODER_LORA_MODULES
        ]
        return overrides

    @staticmethod
    def adapter_module_check(settings: EngineSettings):
        """Refuse adapters with weights the engine would not apply (never half-apply one)."""
        encoder_lora = _encoder_lora_enabled(settings)

        def check(modules: set[str]) -> list[str]:
            refused = unapplied_adapter_modules(modules, enable_tower_connector_lora=encoder_lora)
            if not refused:
                return []
            shown = ", ".join(refused[:6])
            shown += f" (+{len(refused) - 6} more)" if len(refused) > 6 else ""
            why = (
                ""
                if encoder_lora
                else (
                    " (encoder and cross-attention k/v LoRA need enable_tower_connector_lora in "
                    "model.json and the lora_serving vLLM plugin)"
                )
            )
            return [f"LoRA weights this engine would not apply{why}: {shown}"]

        return check

    # ---- request -> jobs ---------------------------------------------------------------------
    def build_plan(self, raw: RawRequest) -> RequestPlan:
        return self.reader.plan(raw, self.requests.job)

    def request_for(
        self, job: TranscriptionJob, samples: np.ndarray, previous: list[int] | None = None
    ) -> tuple[dict, dict]:
        """The engine request (prompt, sampling) of the first decoding attempt of a window
        holding `samples` (the bench sends it as is; a job whose language is known)."""
        return first_request(job, samples, previous)

    # ---- chunks -> outputs -------------------------------------------------------------------
    def render(
        self, job: TranscriptionJob, chunk: GenerationChunk, *, stream: bool
    ) -> dict[str, Any]:
        text = chunk.delta if stream and not chunk.finished else chunk.text
        segments = job.segments if chunk.finished else []
        if chunk.cumulative_logprob is None and chunk.logprobs:  # every window's tokens
            chunk = dataclasses.replace(chunk, cumulative_logprob=sum(chunk.logprobs))
        return {
            "text_output": text,
            "language": job.language or "",
            "segments": json.dumps(segments, ensure_ascii=False),
            # vllm_backend's, over all windows; per-token `logprobs` stay "null" (a row's
            # windows and retries are not one token sequence).
            **additional_outputs.render(
                job.outputs, chunk, stream=stream, sent=job.sent, logprobs_asked=False
            ),
        }


def _encoder_lora_enabled(settings: EngineSettings) -> bool:
    return bool(settings.engine_args.get("enable_tower_connector_lora")) and (
        encoder_lora_supported()
    )
