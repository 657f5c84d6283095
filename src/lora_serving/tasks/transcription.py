"""Whisper speech-to-text: audio (samples or a file) + options -> one job per batch row.

A row's audio is decoded in windows of at most 30 s (`whisper_windows`), each one engine request
with the decoder prompt Whisper was trained on:
    [<|startofprev|> previous text] <|startoftranscript|> <|xx|> <|transcribe|> [<|notimestamps|>]
`language` is any of the model's languages (whisper_languages: all 99 of whisper-base, by code or
name); without it, Whisper's own detection picks <|xx|> among all of them from the first 30 s,
as openai-whisper's `detect_language` does. An English-only model (tiny.en ... medium.en) gets
no language or task tokens, as openai-whisper and transformers prompt it:
    [<|startofprev|> previous text] <|startoftranscript|> [<|notimestamps|>]
and refuses any other language and `translate`. With `timestamps`,
<|notimestamps|> is left out and the engine applies Whisper's timestamp rules
(`whisper_timestamps`), so the output carries segment times.

`hotwords` and `prefix` (sampling_parameters keys) go where faster-whisper's `get_prompt` puts
them: hotwords after <|startofprev|> (before any previous text) wherever no prefix is given, the
prefix after the task tokens of the first window:
    [<|startofprev|> [hotwords] [previous text]] <|startoftranscript|> ... [prefix]

Previous text reaches Whisper in the form it was trained on (<|startofprev|> first), as
openai-whisper and transformers' `generate(prompt_ids=...)` send it: our vLLM plugin
(vllm_plugin/whisper_decoder_prompt) stops vLLM 0.32 from putting another <|startoftranscript|>
in front.
"""

import asyncio
import dataclasses
import functools
import json
import math
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from lora_serving import audio
from lora_serving.adapters.catalog import AdapterCatalog
from lora_serving.errors import EngineUnavailable, InvalidRequest
from lora_serving.jobs import FINAL_ONLY, GenerationChunk, GenerationJob, RequestPlan, Stream
from lora_serving.request_inputs import RawRequest
from lora_serving.settings import EngineSettings
from lora_serving.tasks import (
    additional_outputs,
    whisper_languages,
    whisper_options,
    whisper_timestamps,
    whisper_tokenizer_check,
    whisper_vad,
    whisper_windows,
    whisper_word_refine,
    whisper_words,
)
from lora_serving.tasks.base import RowReader
from lora_serving.tasks.whisper_beam import FASTER_WHISPER, BeamOptions, beam_search
from lora_serving.tasks.whisper_logits import EXTRA_ARG, PROCESSOR, DecodingRules
from lora_serving.tasks.whisper_quality import (
    QualityRules,
    at_temperature_one,
    decode_window,
    is_digital_silence,
    silent_window,
)
from lora_serving.tasks.whisper_windows import decode_seeking, decode_windows
from lora_serving.vllm_plugin import whisper_decoder_prompt
from lora_serving.vllm_plugin.whisper_alignment import EXTRA_ARG as ALIGNMENT_EXTRA_ARG
from lora_serving.vllm_plugin.whisper_encoder_lora import (
    encoder_lora_supported,
    unapplied_adapter_modules,
)

# The longest recording one row may carry (`serving.task.max_audio_seconds` in model.json).
DEFAULT_MAX_AUDIO_SECONDS = 1800.0
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
    output_names = ("text_output", "language", "segments", *additional_outputs.NAMES)

    def __init__(self, settings: EngineSettings, catalog: AdapterCatalog, tokenizer):
        # A tokenizer that encodes otherwise than openai-whisper's refuses the model.
        whisper_tokenizer_check.check(tokenizer, settings.engine_args["model"])
        self.tokenizer = tokenizer
        self.max_model_len = int(settings.engine_args.get("max_model_len") or 448)
        vocab_size = len(tokenizer)
        self.reader = RowReader(
            settings,
            catalog,
            max_tokens_limit=settings.serving.max_tokens_limit or self.max_model_len - 8,
            sampling_defaults={
                "temperature": 0.0,
                "max_tokens": settings.serving.default_max_tokens,
                **whisper_options.decoding_defaults(
                    settings.serving.task, vocab_size, source="model.json"
                ),
            },
            task_fields=whisper_options.task_fields(vocab_size),
        )
        self.suppression = whisper_options.SuppressionLists.from_model_dir(
            Path(settings.engine_args["model"])
        )
        self.max_audio_seconds = float(
            settings.serving.task.get("max_audio_seconds", DEFAULT_MAX_AUDIO_SECONDS)
        )
        self.max_payload_bytes = settings.serving.max_payload_bytes
        self.speech_detector = whisper_vad.SpeechDetector()  # vad_filter: one per model instance
        self.english_only = whisper_languages.english_only(tokenizer)
        self.languages = (
            {"en": tokenizer.convert_tokens_to_ids("<|en|>")}
            if self.english_only
            else whisper_languages.model_languages(settings.engine_args["model"], tokenizer)
        )
        self.no_space_languages = _no_space_languages()
        self.special = {
            name: tokenizer.convert_tokens_to_ids(f"<|{name}|>")
            for name in ("startoftranscript", "startofprev", "notimestamps", *TASKS)
        }
        # transformers' no-speech token: the one before <|notimestamps|> (<|nospeech|>, named
        # <|nocaptions|> in the first multilingual vocabularies).
        self.special["nospeech"] = self.special["notimestamps"] - 1
        self.max_logprobs = int(settings.engine_args.get("max_logprobs", -1))
        if self.max_logprobs < 0:
            self.max_logprobs = vocab_size
        self._decoder_prompt_kept: bool | None = None
        self.alignment_heads = _alignment_heads(Path(settings.engine_args["model"]))
        self.token_text = None  # whisper_words.TokenText, built on the first word request
        self.eager = bool(settings.engine_args.get("enforce_eager"))
        self.timestamp_rules = {
            "timestamp_begin": tokenizer.convert_tokens_to_ids("<|0.00|>"),
            "eot": tokenizer.eos_token_id,
        }

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
        return self.reader.plan(raw, self._job)

    def _job(self, raw: RawRequest, row: int) -> GenerationJob:
        samples = self._audio(raw, row)
        sampling, adapter = self.reader.sampling_and_adapter(raw, row)
        options = {key: sampling.pop(key) for key in whisper_options.DEFAULTS}
        language = self._language(raw, row)
        task = (raw.string("task", row) or "transcribe").strip().lower()
        if task not in TASKS:
            raise InvalidRequest(f"unknown task '{task}'; use one of: {', '.join(TASKS)}")
        if task == "translate" and self.english_only:
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
        job = GenerationJob(
            prompt=None,
            sampling=sampling,
            adapter=adapter,
            decode=self._decode,
            context={
                "samples": samples,
                "task": task,
                "timestamps": timestamps,
                "previous_ids": self._previous_ids(raw.string("prompt", row) or ""),
                "hotword_ids": self._text_ids(options["hotwords"]),
                "prefix_ids": prefix_ids,
                "suppressed": suppressed,
                "quality": QualityRules.from_options(options),
                "beam": beam,
                "condition_on_previous_text": options["condition_on_previous_text"],
                "segments": [],  # filled while decoding with timestamps
                "outcomes": [],  # each window's accepted attempt (whisper_quality)
                "nonce": uuid.uuid4().hex,  # names the row's windows for the encoder memo
                "words": WordOptions.from_options(options) if word_timestamps else None,
                "outputs": additional_outputs.requested(raw, range(raw.batch_size)),
            },
        )
        if language is None and not self.english_only:
            job.prepare = self._detect_language
        else:  # an English-only model has no detection: its language is English
            self._set_prompts(job, language or "en")
        if options["vad_filter"]:
            whisper_vad.filter_job(job, self.speech_detector, options["vad_parameters"])
        return job

    def _check_word_timestamps(self, task: str) -> None:
        if not self.alignment_heads:
            raise InvalidRequest(
                "word_timestamps needs the model's alignment heads (generation_config.json "
                "'alignment_heads'), which this model does not have"
            )
        if not self.eager:
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
        if needed > self.max_logprobs:
            raise InvalidRequest(
                f"beam_size {beam.size} with {len(suppressed[0])} suppressed tokens needs "
                f"{needed} log-probabilities per step; this engine gives at most "
                f"{self.max_logprobs} (engine argument max_logprobs in model.json)"
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
        if self.english_only:
            return whisper_languages.resolve_english_only(language)
        return whisper_languages.resolve(language, self.languages)

    def _previous_ids(self, text: str) -> list[int]:
        """Previous text as tokens, its last half-context at most (as openai-whisper keeps)."""
        if not text.strip():
            return []
        ids = self.tokenizer.encode(" " + text.strip(), add_special_tokens=False)
        return ids[-(self.max_model_len // 2 - 1) :]

    def _text_ids(self, text: str | None) -> list[int]:
        """hotwords / prefix as tokens, cut to half the context (faster-whisper's get_prompt)."""
        if not text or not text.strip():
            return []
        ids = self.tokenizer.encode(" " + text.strip(), add_special_tokens=False)
        return ids[: self.max_model_len // 2 - 1]

    def _set_prompts(self, job: GenerationJob, language: str) -> None:
        """The decoder prompt's task part and the sampling every window of the row uses."""
        context = job.context
        task_ids = [self.special["startoftranscript"]]
        if not self.english_only:
            task_ids += [self.languages[language], self.special[context["task"]]]
        if not context["timestamps"]:
            task_ids.append(self.special["notimestamps"])
        sampling = dict(job.sampling)
        sampling.setdefault("logprobs", 0)  # the chosen tokens' (whisper_quality's average)
        everywhere, at_begin = context["suppressed"]
        rules = DecodingRules(
            suppress=everywhere,
            suppress_at_begin=at_begin,
            timestamps=whisper_timestamps.TimestampRules(**self.timestamp_rules)
            if context["timestamps"]
            else None,
        )
        if not rules.empty:
            sampling["extra_args"] = {EXTRA_ARG: rules.as_extra_arg()}
        context.update(language=language, task_ids=task_ids, window_sampling=sampling, rules=rules)

    def _decoder_ids(self, job: GenerationJob, previous: list[int], *, first: bool) -> list[int]:
        """faster-whisper's get_prompt: [<|startofprev|> [hotwords] [previous text]]
        <|startoftranscript|> <|xx|> <|task|> [<|notimestamps|>] [prefix, first window only]"""
        prefix = job.context["prefix_ids"] if first else []
        hotwords = [] if prefix else job.context["hotword_ids"]
        ids = []
        if previous or hotwords:
            previous = previous[-(self.max_model_len // 2 - 1) :] if previous else []
            ids = [self.special["startofprev"], *hotwords, *previous]
        return ids + job.context["task_ids"] + prefix

    def _window_sampling(self, job: GenerationJob, ids: list[int], temperature: float) -> dict:
        # Without our plugin vLLM adds <|startoftranscript|> in front of a prompt that lacks it.
        prefixed = not self._prompt_kept() and ids[0] != self.special["startoftranscript"]
        sampling = dict(job.context["window_sampling"], temperature=temperature)
        sampling["max_tokens"] = min(
            sampling["max_tokens"], self.max_model_len - len(ids) - prefixed
        )
        return sampling

    @staticmethod
    def _windows(job: GenerationJob) -> list[audio.AudioWindow]:
        """The row's windows without timestamps: VAD's speech windows, else 30 s cuts."""
        context = job.context
        if not context.get("speech_windows") and "windows" not in context:
            context["windows"] = audio.split_windows(context["samples"])
        return context.get("speech_windows") or context["windows"]

    def _prompt_kept(self) -> bool:
        """Whether our plugin keeps decoder prompts as given (asked once: it does not change
        once the engine runs)."""
        if self._decoder_prompt_kept is None:
            self._decoder_prompt_kept = whisper_decoder_prompt.applied()
        return self._decoder_prompt_kept

    def request_for(
        self,
        job: GenerationJob,
        samples: np.ndarray,
        previous: list[int] | None = None,
        *,
        first: bool = True,
    ) -> tuple[dict, dict]:
        """The engine request (prompt, sampling) of a window's first decoding attempt (`first`:
        the row's first window, which takes the prefix)."""
        ids = self._decoder_ids(
            job, job.context["previous_ids"] if previous is None else previous, first=first
        )
        temperature = job.context["quality"].temperatures[0]
        return _whisper_prompt(samples, ids), self._window_sampling(job, ids, temperature)

    async def _detect_language(self, job: GenerationJob, generate) -> None:
        """Whisper's own detection on the first 30 s: the likeliest language token."""
        first = job.context["samples"][: int(audio.WINDOW_SECONDS * audio.WHISPER_SAMPLE_RATE)]
        chunk = await generate(
            _whisper_prompt(first, [self.special["startoftranscript"]]),
            {
                "temperature": 0.0,
                "max_tokens": 1,
                "allowed_token_ids": list(self.languages.values()),
            },
        )
        by_id = {token: code for code, token in self.languages.items()}
        self._set_prompts(job, by_id[chunk.token_ids[0]])

    def _decode(self, job: GenerationJob, stream: Stream):
        context = job.context
        separator = "" if context["language"] in self.no_space_languages else " "
        windows = iter(range(1_000_000))
        # The window `prefix` starts (prefix is refused with timestamps, so only without them).
        first_window = None if context["timestamps"] else self._windows(job)[0].samples

        def window_decoder(samples: np.ndarray, previous: list[int] | None = None):
            if is_digital_silence(samples):
                return silent_window(context["outcomes"])
            ids = self._decoder_ids(
                job,
                context["previous_ids"] if previous is None else previous,
                first=samples is first_window,
            )
            name = f"{context['nonce']}-{next(windows)}"  # shared by the window's requests
            context["window_name"] = name  # the window's word alignment shares it too
            quality = context["quality"]
            probe = None
            if quality.no_speech_threshold is not None:
                probe = functools.partial(self._no_speech_prob, stream, samples, ids, name)
            attempt = functools.partial(self._attempt, job, stream, samples, ids, name)
            return decode_window(attempt, probe, quality, outcomes=context["outcomes"])

        if not context["timestamps"]:
            return decode_windows(
                self._windows(job), decode_window=window_decoder, separator=separator
            )
        return decode_seeking(
            context["samples"],
            decode_window=window_decoder,
            read=functools.partial(whisper_timestamps.read_window, **self.timestamp_rules),
            decode=self.tokenizer.decode,
            separator=separator,
            segments=context["segments"],
            outcomes=context["outcomes"],
            condition_on_previous_text=context["condition_on_previous_text"],
            initial_prompt=context["previous_ids"],
            timestamp_begin=self.timestamp_rules["timestamp_begin"],
            align=None if context["words"] is None else functools.partial(self._align, job, stream),
        )

    async def _align(self, job: GenerationJob, stream: Stream, samples, segments, offset_s):
        """A window's words: one teacher-forced engine request with the row's adapter, the
        window's audio and its text (vllm_plugin/whisper_alignment captures the alignment
        heads), then openai-whisper's timing steps (whisper_words), then the refinement.
        Returns openai-whisper's last word end (where its next window would start)."""
        context = job.context
        words: WordOptions = context["words"]
        eot = self.timestamp_rules["eot"]
        text_tokens = whisper_words.window_text_tokens(segments, eot)
        if not text_tokens:
            for segment in segments:
                segment["words"] = []
            return None
        sot = context["task_ids"]  # <|startoftranscript|> <|xx|> <|task|> (timestamps: no more)
        ids = [*sot, self.special["notimestamps"], *text_tokens, eot]
        if len(ids) > self.max_model_len:
            raise InvalidRequest(
                f"a window's text ({len(text_tokens)} tokens) is too long to align its words"
            )
        frames = len(samples) // whisper_windows.SAMPLES_PER_FRAME  # openai-whisper's num_frames
        flag = {
            "key": f"{context['window_name']}-words",
            "heads": self.alignment_heads,
            "frames": frames // 2,
            "text_from": len(sot),
            "eot": eot,
        }
        sampling = {
            "temperature": 0.0,
            "max_tokens": 1,
            "detokenize": False,
            "extra_args": {ALIGNMENT_EXTRA_ARG: flag},
            FINAL_ONLY: True,
        }
        last = None
        async for chunk in stream(_whisper_prompt(samples, ids, context["window_name"]), sampling):
            last = chunk
        result = last.alignment if last is not None else None
        if not result or "error" in result:
            why = (result or {}).get("error", "the engine gave none")
            raise EngineUnavailable(f"word timestamps could not be aligned: {why}")
        matrix = np.frombuffer(result["matrix"], dtype=np.float32).reshape(result["shape"])
        if self.token_text is None:
            self.token_text = whisper_words.TokenText(self.tokenizer)
        alignment = whisper_words.word_timings(
            matrix,
            result["probabilities"],
            text_tokens,
            functools.partial(
                whisper_words.split_to_word_tokens,
                decode=self.token_text,
                eot=eot,
                language=context["language"],
            ),
            eot,
        )
        whisper_words.add_word_timestamps(
            segments,
            alignment,
            time_offset=offset_s,
            last_speech_timestamp=context.get("last_speech_s", 0.0),
            prepend_punctuations=words.prepend_punctuations,
            append_punctuations=words.append_punctuations,
        )
        end = whisper_words.last_word_end(segments)
        if end is not None:
            context["last_speech_s"] = end
        for segment in segments:  # openai-whisper's times, before the refinement moves them
            segment["aligned"] = (segment["start"], segment["end"])
        if words.refine:
            whisper_word_refine.refine(segments, await self._speech(context))
        return end

    async def _speech(self, context: dict) -> list:
        """Where the row's (decoded) samples hold speech, for word_timestamps_refine: Silero VAD
        once per row, off the engine loop."""
        if "word_speech" not in context:
            chunks = await asyncio.to_thread(
                self.speech_detector.speech_chunks,
                context["samples"],
                whisper_word_refine.SPEECH_OPTIONS,
            )
            context["word_speech"] = whisper_word_refine.speech_spans(chunks)
        return context["word_speech"]

    async def _attempt(self, job, stream: Stream, samples, ids: list[int], name: str, temperature):
        """One decoding of a window at one temperature: the engine's chunks, or a beam search's
        result as one finished chunk."""
        sampling = self._window_sampling(job, ids, temperature)
        beam: BeamOptions = job.context["beam"]
        if temperature > 0 and job.context["quality"].may_retry:
            # Held until accepted anyway: every log-probability, to rescale to temperature 1
            # (not detokenized by vLLM: 51,865 tokens a step would cost more than the decoding).
            sampling.update(logprobs=-1, **{FINAL_ONLY: True})
            sampling["detokenize"] = bool(sampling.get("stop"))  # stop strings need the text
            async for chunk in stream(_whisper_prompt(samples, ids, name), sampling):
                text = self.tokenizer.decode(chunk.token_ids, skip_special_tokens=True)
                chunk = dataclasses.replace(chunk, text=text, delta=text)
                yield at_temperature_one(chunk, temperature)
            return
        if temperature > 0 or beam.size == 1:
            async for chunk in stream(_whisper_prompt(samples, ids, name), sampling):
                yield chunk
            return
        everywhere, at_begin = job.context["suppressed"]
        top_k = beam.top_k_needed(len(set(everywhere) | set(at_begin)))

        rules: DecodingRules = job.context["rules"]

        async def score_next(tokens: list[int]) -> dict[int, float]:
            step = {"temperature": 0.0, "max_tokens": 1, "logprobs": top_k}
            if beam.rules_in_engine and not rules.empty:  # log-probabilities after the rules
                after = dataclasses.replace(rules, sampled_before=tuple(tokens))
                step["extra_args"] = {EXTRA_ARG: after.as_extra_arg()}
            last = None
            async for chunk in stream(_whisper_prompt(samples, ids + tokens, name), step):
                last = chunk
            return {token: entry.logprob for token, entry in last.top_logprobs[0].items()}

        result = await beam_search(
            score_next,
            options=beam,
            max_tokens=sampling["max_tokens"],
            end_of_text=self.timestamp_rules["eot"],
            suppress=frozenset(everywhere),
            suppress_at_begin=frozenset(at_begin),
        )
        text = self.tokenizer.decode(result.tokens, skip_special_tokens=True)
        yield GenerationChunk(
            text, text, result.tokens, result.logprobs, len(ids), result.finish_reason
        )

    async def _no_speech_prob(self, stream: Stream, samples, ids: list[int], name: str) -> float:
        """P(<|nospeech|>) right after <|startoftranscript|> (after the previous text, if any),
        from the raw logits, as openai-whisper and transformers measure it."""
        nospeech = self.special["nospeech"]
        upto = ids.index(self.special["startoftranscript"]) + 1
        probe = {"temperature": 0.0, "max_tokens": 1, "logprob_token_ids": [nospeech]}
        last = None
        async for chunk in stream(_whisper_prompt(samples, ids[:upto], name), probe):
            last = chunk
        return math.exp(last.top_logprobs[0][nospeech].logprob)

    # ---- chunks -> outputs -------------------------------------------------------------------
    def render(self, job: GenerationJob, chunk: GenerationChunk, *, stream: bool) -> dict[str, Any]:
        text = chunk.delta if stream and not chunk.finished else chunk.text
        segments = job.context["segments"] if chunk.finished else []
        if chunk.cumulative_logprob is None and chunk.logprobs:  # every window's tokens
            chunk = dataclasses.replace(chunk, cumulative_logprob=sum(chunk.logprobs))
        return {
            "text_output": text,
            "language": job.context.get("language", ""),
            "segments": json.dumps(segments, ensure_ascii=False),
            # vllm_backend's, over all windows; per-token `logprobs` stay "null" (a row's
            # windows and retries are not one token sequence).
            **additional_outputs.render(
                job.context["outputs"],
                chunk,
                stream=stream,
                state=job.context,
                logprobs_asked=False,
            ),
        }


def _whisper_prompt(
    samples: np.ndarray, decoder_ids: list[int], name: str | None = None
) -> dict[str, Any]:
    """`name` identifies the window's audio to vLLM (multi_modal_uuids): requests of one window
    share it, so the encoder memo (vllm_plugin/whisper_encoder_memo) encodes it once."""
    encoder_prompt: dict[str, Any] = {
        "prompt": "",
        "multi_modal_data": {"audio": (samples, audio.WHISPER_SAMPLE_RATE)},
    }
    if name is not None:
        encoder_prompt["multi_modal_uuids"] = {"audio": [name]}
    return {
        "encoder_prompt": encoder_prompt,
        "decoder_prompt": {"prompt_token_ids": list(decoder_ids)},
    }


@dataclasses.dataclass(frozen=True)
class WordOptions:
    prepend_punctuations: str
    append_punctuations: str
    refine: bool

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "WordOptions":
        return cls(
            options["prepend_punctuations"],
            options["append_punctuations"],
            options["word_timestamps_refine"],
        )


def _alignment_heads(model_dir: Path) -> list[list[int]]:
    """generation_config `alignment_heads`: [[decoder layer, head], ...] ([] without one)."""
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return []
    heads = json.loads(path.read_text()).get("alignment_heads") or []
    return [[int(layer), int(head)] for layer, head in heads]


def _encoder_lora_enabled(settings: EngineSettings) -> bool:
    return bool(settings.engine_args.get("enable_tower_connector_lora")) and (
        encoder_lora_supported()
    )


def _no_space_languages() -> set[str]:
    """Languages whose windows join without a space: vLLM's list (Chinese, Japanese) and
    Cantonese, which Whisper writes in Chinese characters too."""
    from vllm.model_executor.models.whisper import WhisperForConditionalGeneration

    return set(WhisperForConditionalGeneration.no_space_languages) | {"yue"}
