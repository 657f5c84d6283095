"""Whisper speech-to-text: audio (samples or a file) + options -> decoder prompt + audio job."""

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from lora_serving import audio
from lora_serving.adapters import AdapterCatalog
from lora_serving.errors import InvalidRequest
from lora_serving.jobs import GenerationChunk, GenerationJob, RequestPlan
from lora_serving.request_inputs import RawRequest
from lora_serving.settings import EngineSettings
from lora_serving.tasks.base import RowReader

# One Whisper window; longer recordings are refused until windowed decoding exists.
MAX_AUDIO_SECONDS = 30.0
TASKS = ("transcribe", "translate")
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
    output_names = ("text_output", "language")

    def __init__(self, settings: EngineSettings, catalog: AdapterCatalog, tokenizer):
        self.tokenizer = tokenizer
        max_len = int(settings.engine_args.get("max_model_len") or 448)
        self.reader = RowReader(
            settings,
            catalog,
            max_tokens_limit=settings.serving.max_tokens_limit or max_len - 8,
            sampling_defaults={
                "temperature": 0.0,
                "max_tokens": settings.serving.default_max_tokens,
            },
        )
        self.languages = _language_tokens(tokenizer)
        self.special = {
            name: tokenizer.convert_tokens_to_ids(f"<|{name}|>")
            for name in ("startoftranscript", "startofprev", "notimestamps", *TASKS)
        }

    @staticmethod
    def engine_overrides(settings: EngineSettings) -> dict[str, Any]:
        """Restrict LoRA wrappers to the decoder modules adapters can target today.

        vLLM 0.32 wraps every linear layer, the encoder's included; with an adapter active, the
        encoder's wrappers apply a decoder-token mapping to 1500 frames per audio and the engine
        dies (einsum size mismatch) as soon as a decoder prompt has more than one token.
        """
        if not settings.lora_enabled or "lora_target_modules" in settings.engine_args:
            return {}
        config = json.loads((Path(settings.engine_args["model"]) / "config.json").read_text())
        return {
            "lora_target_modules": [
                f"model.decoder.layers.{layer}.{module}"
                for layer in range(int(config["decoder_layers"]))
                for module in DECODER_LORA_MODULES
            ]
        }

    @staticmethod
    def adapter_module_check(settings: EngineSettings):
        """Refuse adapters with weights the engine would not apply (never half-apply one)."""
        return _unsupported_whisper_modules

    # ---- request -> jobs ---------------------------------------------------------------------
    def build_plan(self, raw: RawRequest) -> RequestPlan:
        rows = self.reader.rows(raw)
        stream = self.reader.stream_flag(raw, rows)
        return RequestPlan([self._job(raw, row) for row in rows], stream=stream)

    def _job(self, raw: RawRequest, row: int) -> GenerationJob:
        samples = self._audio(raw, row)
        sampling, adapter = self.reader.sampling_and_adapter(raw, row)
        language = raw.string("language", row)
        if language is not None:
            language = language.strip().lower()
            if language not in self.languages:
                raise InvalidRequest(
                    f"unknown language '{language}'; use an ISO 639-1 code Whisper knows "
                    f"({', '.join(sorted(self.languages)[:12])}, ...) or leave it out to detect"
                )
        task = (raw.string("task", row) or "transcribe").strip().lower()
        if task not in TASKS:
            raise InvalidRequest(f"unknown task '{task}'; use one of: {', '.join(TASKS)}")
        previous_text = raw.string("prompt", row) or ""
        job = GenerationJob(
            prompt=None,
            sampling=sampling,
            adapter=adapter,
            context={"audio": samples, "task": task, "previous_text": previous_text},
        )
        if language is None:
            job.prepare = self._detect_language
        else:
            self._set_prompt(job, language)
        return job

    def _audio(self, raw: RawRequest, row: int) -> np.ndarray:
        has_samples, has_file = raw.has("audio"), raw.has("audio_file")
        if has_samples == has_file:
            raise InvalidRequest("send exactly one of 'audio' (samples) or 'audio_file' (bytes)")
        if has_file:
            files = raw.raw_bytes("audio_file", row)
            if len(files) != 1:
                raise InvalidRequest("input 'audio_file' must hold exactly one encoded file")
            samples, rate = audio.decode_audio_file(files[0], max_seconds=MAX_AUDIO_SECONDS)
        else:
            samples = raw.array("audio", row)
            length = raw.integer("audio_length", row, default=None)
            if length is not None:
                if not 0 < length <= samples.shape[-1]:
                    raise InvalidRequest(
                        f"audio_length {length} must be in 1..{samples.shape[-1]} (the row length)"
                    )
                samples = samples[..., :length]
            rate = raw.integer("sample_rate", row, default=audio.WHISPER_SAMPLE_RATE)
        return audio.to_whisper_input(samples, rate, max_seconds=MAX_AUDIO_SECONDS)

    def _set_prompt(self, job: GenerationJob, language: str) -> None:
        ids = []
        if job.context["previous_text"]:
            ids.append(self.special["startofprev"])
            ids.extend(
                self.tokenizer.encode(
                    " " + job.context["previous_text"].strip(), add_special_tokens=False
                )
            )
        ids += [
            self.special["startoftranscript"],
            self.languages[language],
            self.special[job.context["task"]],
            self.special["notimestamps"],
        ]
        job.context["language"] = language
        job.prompt = {
            "encoder_prompt": {
                "prompt": "",
                "multi_modal_data": {"audio": (job.context["audio"], audio.WHISPER_SAMPLE_RATE)},
            },
            "decoder_prompt": {"prompt_token_ids": ids},
        }

    async def _detect_language(self, job: GenerationJob, generate) -> None:
        """Whisper's own detection: the most likely language token after <|startoftranscript|>."""
        prompt = {
            "encoder_prompt": {
                "prompt": "",
                "multi_modal_data": {"audio": (job.context["audio"], audio.WHISPER_SAMPLE_RATE)},
            },
            "decoder_prompt": {"prompt_token_ids": [self.special["startoftranscript"]]},
        }
        chunk = await generate(
            prompt,
            {
                "temperature": 0.0,
                "max_tokens": 1,
                "allowed_token_ids": list(self.languages.values()),
            },
        )
        by_id = {token: code for code, token in self.languages.items()}
        self._set_prompt(job, by_id[chunk.token_ids[0]])

    # ---- chunks -> outputs -------------------------------------------------------------------
    def render(self, job: GenerationJob, chunk: GenerationChunk, *, stream: bool) -> dict[str, Any]:
        text = chunk.delta if stream and not chunk.finished else chunk.text
        return {
            "text_output": text.strip() if chunk.finished else text,
            "language": job.context.get("language", ""),
        }


# vLLM 0.32 maps LoRA rows per decoder token, so encoder layers and the cross-attention k/v
# (which run over encoder frames) cannot take LoRA yet.
_ENCODER_SIDE = re.compile(r"(^|\.)encoder\.layers\.\d+\.|encoder_attn\.(k_proj|v_proj)$")


def _unsupported_whisper_modules(modules: set[str]) -> list[str]:
    refused = sorted(m for m in modules if _ENCODER_SIDE.search(m))
    if not refused:
        return []
    shown = ", ".join(refused[:6]) + (f" (+{len(refused) - 6} more)" if len(refused) > 6 else "")
    return [f"LoRA weights on encoder-side modules cannot be applied by this engine: {shown}"]


def _language_tokens(tokenizer) -> dict[str, int]:
    """ISO 639-1 code -> its <|xx|> token id, for every code this tokenizer has."""
    from vllm.model_executor.models.whisper import ISO639_1_SUPPORTED_LANGS

    unknown = tokenizer.unk_token_id
    found = {}
    for code in ISO639_1_SUPPORTED_LANGS:
        token_id = tokenizer.convert_tokens_to_ids(f"<|{code}|>")
        if token_id is not None and token_id != unknown:
            found[code] = token_id
    return found
