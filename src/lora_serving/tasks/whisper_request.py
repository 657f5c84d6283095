"""A Whisper request's batch row -> TranscriptionJob: audio, language, task, options, checks.

Everything a row can get wrong is refused here, before any engine work, with a message that
names the input and the allowed values. The row's language, when given, is resolved here too
(any of the model's languages by code or name, `whisper_languages`); without it the job detects
it when it runs.
"""

from pathlib import Path

import numpy as np

from lora_serving import audio
from lora_serving.errors import InvalidRequest
from lora_serving.request_inputs import RawRequest
from lora_serving.settings import EngineSettings
from lora_serving.tasks import additional_outputs, whisper_languages, whisper_options, whisper_vad
from lora_serving.tasks.base import RowReader
from lora_serving.tasks.whisper_beam import FASTER_WHISPER, BeamOptions
from lora_serving.tasks.whisper_job import TranscriptionJob, WordOptions
from lora_serving.tasks.whisper_model import TASKS, WhisperModel
from lora_serving.tasks.whisper_quality import QualityRules

# The longest recording one row may carry (`serving.task.max_audio_seconds` in model.json).
DEFAULT_MAX_AUDIO_SECONDS = 1800.0


class TranscriptionRequestReader:
    def __init__(self, settings: EngineSettings, model: WhisperModel, rows: RowReader):
        self.model = model
        self.rows = rows
        self.suppression = whisper_options.SuppressionLists.from_model_dir(
            Path(settings.engine_args["model"])
        )
        self.max_audio_seconds = float(
            settings.serving.task.get("max_audio_seconds", DEFAULT_MAX_AUDIO_SECONDS)
        )
        self.max_payload_bytes = settings.serving.max_payload_bytes

    def job(self, raw: RawRequest, row: int) -> TranscriptionJob:
        model = self.model
        samples = self._audio(raw, row)
        sampling, adapter = self.rows.sampling_and_adapter(raw, row)
        options = {key: sampling.pop(key) for key in whisper_options.DEFAULTS}
        language = self._language(raw, row)
        task = (raw.string("task", row) or "transcribe").strip().lower()
        if task not in TASKS:
            raise InvalidRequest(f"unknown task '{task}'; use one of: {', '.join(TASKS)}")
        if task == "translate" and model.english_only:
            raise InvalidRequest(
                "task 'translate' is not available: this model is English-only (it transcribes "
                "English only); send task 'transcribe' or leave it out"
            )
        word_timestamps = options["word_timestamps"]
        timestamps = raw.boolean("timestamps", row, default=False) or word_timestamps
        if word_timestamps:
            self._check_word_timestamps(task)
        suppressed = self.suppression.resolve(options)
        beam = BeamOptions(
            options["beam_size"],
            length_penalty=float(options["length_penalty"]),
            patience=float(options["patience"]),
            rule=options["beam_rule"],
        )
        self._check_beam(beam, timestamps, suppressed)
        prefix_ids = self._text_ids(options["prefix"])
        if prefix_ids and timestamps:
            raise InvalidRequest(
                "'prefix' is not supported with timestamps=true (send it without timestamps, "
                "or use 'prompt' / 'hotwords')"
            )
        job = TranscriptionJob(
            model=model,
            adapter=adapter,
            samples=samples,
            sampling=sampling,
            task=task,
            language=None,
            timestamps=timestamps,
            previous_ids=self._previous_ids(raw.string("prompt", row) or ""),
            hotword_ids=self._text_ids(options["hotwords"]),
            prefix_ids=prefix_ids,
            suppressed=suppressed,
            quality=QualityRules.from_options(options),
            beam=beam,
            condition_on_previous_text=options["condition_on_previous_text"],
            words=WordOptions.from_options(options) if word_timestamps else None,
            vad=(
                whisper_vad.VadOptions.from_dict(options["vad_parameters"])
                if options["vad_filter"]
                else None
            ),
            outputs=additional_outputs.requested(raw, range(raw.batch_size)),
        )
        if language is not None or model.english_only:  # English-only: no detection
            job.use_language(language or "en")
        return job

    def _check_word_timestamps(self, task: str) -> None:
        if not self.model.alignment_heads:
            raise InvalidRequest(
                "word_timestamps needs the model's alignment heads (generation_config.json "
                "'alignment_heads'), which this model does not have"
            )
        if not self.model.eager:
            raise InvalidRequest(
                "word_timestamps needs the engine in eager mode (enforce_eager in model.json): "
                "the alignment heads cannot be read from its compiled decoder"
            )
        if task == "translate":  # openai-whisper: "not supported for translations"
            raise InvalidRequest("word_timestamps is not supported with task 'translate'")

    def _check_beam(self, beam: BeamOptions, timestamps: bool, suppressed) -> None:
        if beam.size == 1:
            return
        if timestamps and not beam.rules_in_engine:
            raise InvalidRequest(
                f"beam_size > 1 with timestamps=true needs beam_rule '{FASTER_WHISPER}' (the "
                f"'{beam.rule}' rule has no timestamp form); or send beam_size 1"
            )
        needed = beam.top_k_needed(len(set(suppressed[0]) | set(suppressed[1])))
        if needed > self.model.max_logprobs:
            raise InvalidRequest(
                f"beam_size {beam.size} with {len(suppressed[0])} suppressed tokens needs "
                f"{needed} log-probabilities per step; this engine gives at most "
                f"{self.model.max_logprobs} (engine argument max_logprobs in model.json)"
            )

    def _audio(self, raw: RawRequest, row: int) -> np.ndarray:
        has_samples, has_file = raw.has("audio"), raw.has("audio_file")
        if has_samples == has_file:
            raise InvalidRequest("send exactly one of 'audio' (samples) or 'audio_file' (bytes)")
        if has_file:
            files = raw.raw_bytes("audio_file", row)
            if len(files) != 1:
                raise InvalidRequest("input 'audio_file' must hold exactly one encoded file")
            self._check_payload("audio_file", len(files[0]))
            samples, rate = audio.decode_audio_file(files[0], max_seconds=self.max_audio_seconds)
        else:
            samples = raw.array("audio", row)
            self._check_payload("audio", samples.nbytes)
            length = raw.integer("audio_length", row, default=None)
            if length is not None:
                if not 0 < length <= samples.shape[-1]:
                    raise InvalidRequest(
                        f"audio_length {length} must be in 1..{samples.shape[-1]} (the row length)"
                    )
                samples = samples[..., :length]
            rate = raw.integer("sample_rate", row, default=audio.WHISPER_SAMPLE_RATE)
        return audio.to_whisper_input(samples, rate, max_seconds=self.max_audio_seconds)

    def _check_payload(self, name: str, size: int) -> None:
        if size > self.max_payload_bytes:
            raise InvalidRequest(
                f"input '{name}' holds {size} bytes; at most {self.max_payload_bytes} allowed"
            )

    def _language(self, raw: RawRequest, row: int) -> str | None:
        """The row's language code ("de", "german" and "German" alike), None: detect it."""
        language = raw.string("language", row)
        if language is None or not language.strip():
            return None
        if self.model.english_only:
            return whisper_languages.resolve_english_only(language)
        return whisper_languages.resolve(language, self.model.languages)

    def _previous_ids(self, text: str) -> list[int]:
        """Previous text as tokens, its last half-context at most (as openai-whisper keeps)."""
        if not text.strip():
            return []
        ids = self.model.tokenizer.encode(" " + text.strip(), add_special_tokens=False)
        return ids[-(self.model.max_model_len // 2 - 1) :]

    def _text_ids(self, text: str | None) -> list[int]:
        """hotwords / prefix as tokens, cut to half the context (faster-whisper's get_prompt)."""
        if not text or not text.strip():
            return []
        ids = self.model.tokenizer.encode(" " + text.strip(), add_special_tokens=False)
        return ids[: self.model.max_model_len // 2 - 1]
