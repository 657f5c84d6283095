"""The other Whisper shapes users fine-tune, served by our own serving code in-process (model.json
-> EngineSettings, AdapterCatalog, TranscriptionTask, EngineHost on vLLM; no Triton), every
adapter kind in one mixed batch, each row equal to transformers on the PEFT-merged float32
weights, token for token:

- whisper-tiny.en, the second real size (English-only: no language or task tokens; docs/models.md),
  on espeak-ng speech;
- whisper-v3-shape, a tiny random model shaped like large-v3 / large-v3-turbo (128 mel bins, the
  51,866-token vocabulary with <|yue|>, 4 decoder layers): transcribe, translate, language
  detection (which picks yue: demo/whisper_v3_shape says how), previous text and timestamps;
  its word timestamps (every adapter kind; the first window) equal openai-whisper's own
  transcribe(word_timestamps=True) on the merged weights (tests/openai_whisper/).

The reference builds its prompts from the tokenizer's special tokens itself and detects the
language with transformers' `detect_language`; served decoding runs with model.json's rules at
temperature 0 only (no fallback) and no no-speech check, as the reference decodes.
"""

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from tests.conftest import load_16k
from tests.reference.whisper import reference_features, reference_generate
from tests.unit.test_transcription import request

pytestmark = pytest.mark.engine

KINDS = ("decoder", "encoder_only", "cross_kv", "all_layers")
MAX_TOKENS = 12
LOGPROB_TOKENS, LOGPROB_TOLERANCE = 5, 2e-3
# An adapter must move the merged reference's log-probabilities by more than this (or its tokens).
ADAPTER_EFFECT = 0.05
NAMED = {"cantonese": "yue"}  # openai-whisper's names the requests use
GREEDY = {"temperature": 0.0, "no_speech_threshold": None, "max_tokens": MAX_TOKENS}


@dataclass(frozen=True)
class Row:
    """One request row: adapter kind (None = base), audio, and the request's own inputs."""

    adapter: str | None
    audio: str
    inputs: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.adapter or 'base'}/{self.audio}/{json.dumps(self.inputs)}"


def synthetic_audio(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(16_000 * (1 + seed % 4)) / 16_000
    tone = 0.3 * np.sin(2 * np.pi * (200 + 100 * seed) * t)
    return (tone + 0.1 * rng.standard_normal(t.size)).astype(np.float32)


class Served:
    """whisper_lora's serving code for one model folder, its adapters in multi_lora.json."""

    def __init__(self, model_dir: Path, adapters_dir: Path, work: Path):
        from lora_serving.adapters.catalog import AdapterCatalog
        from lora_serving.engine import lora_slots
        from lora_serving.engine.engine_host import EngineHost
        from lora_serving.settings import EngineSettings
        from lora_serving.tasks import load_tokenizer
        from lora_serving.tasks.transcription import TranscriptionTask

        self.model_dir, self.adapters_dir = model_dir, adapters_dir
        (work / "multi_lora.json").write_text(
            json.dumps({kind: str(adapters_dir / kind) for kind in KINDS})
        )
        model_json = {
            "model": str(model_dir),
            "dtype": "float32",
            "enforce_eager": True,
            "max_model_len": 448,
            "max_num_seqs": 32,
            "limit_mm_per_prompt": {"audio": 1},
            "enable_lora": True,
            "enable_tower_connector_lora": True,
            "max_loras": len(KINDS),
            "max_lora_rank": 8,
            "environment": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        }
        settings = EngineSettings.from_dict(model_json, model_dir=work)
        settings = settings.with_engine_args(TranscriptionTask.engine_overrides(settings))
        # The worker extension the Triton model host adds (word alignments come back through it).
        settings = settings.with_engine_args({"worker_extension_cls": lora_slots.EXTENSION})
        catalog = AdapterCatalog.from_multi_lora_json(
            settings.multi_lora_path,
            enabled=True,
            max_lora_rank=8,
            module_check=TranscriptionTask.adapter_module_check(settings),
        )
        self.tokenizer = load_tokenizer(str(model_dir))
        self.task = TranscriptionTask(settings, catalog, self.tokenizer)
        self.host = EngineHost(settings)
        started = time.monotonic()
        self.host.start()
        print(f"\n{model_dir.name}: engine start {time.monotonic() - started:.1f} s")

    def transcribe(
        self, rows: list[Row], audios: dict[str, np.ndarray], sampling: dict = GREEDY
    ) -> list[tuple]:
        """All rows submitted at once (one mixed batch): (token ids, their log-probabilities,
        language, the job) per row."""
        jobs = []
        for row in rows:
            inputs = {"audio": audios[row.audio], **row.inputs}
            inputs["sampling_parameters"] = json.dumps(sampling)
            if row.adapter:
                inputs["lora_name"] = row.adapter
            [job] = self.task.build_plan(request(**inputs)).jobs
            jobs.append(job)

        async def last_chunk(job):
            last = None
            async with self.host.session(job.adapter, stream=False) as engine:
                async for chunk in job.run(engine):
                    last = chunk
            return last.token_ids, last.logprobs, job.language, job

        futures = [self.host.submit(last_chunk(job)) for job in jobs]
        return [future.result(timeout=600) for future in futures]

    def close(self) -> None:
        if self.host is not None:
            self.host.close(drain_timeout_s=0)
            self.host = None


def adapter_dir(served: Served, kind: str | None) -> Path | None:
    return None if kind is None else served.adapters_dir / kind


def special(tokenizer, name: str) -> int:
    return tokenizer.convert_tokens_to_ids(f"<|{name}|>")


def reference_prompt(tokenizer, row: Row, language: str | None) -> list[int]:
    """openai-whisper's prompt, from the tokenizer's special tokens: [<|startofprev|> text]
    <|startoftranscript|> [<|lang|> <|task|>] [<|notimestamps|>]."""
    ids = []
    if row.inputs.get("prompt"):
        text = " " + row.inputs["prompt"].strip()
        ids = [special(tokenizer, "startofprev"), *tokenizer.encode(text, add_special_tokens=False)]
    ids.append(special(tokenizer, "startoftranscript"))
    if language is not None:
        ids += [
            special(tokenizer, language),
            special(tokenizer, row.inputs.get("task", "transcribe")),
        ]
    if not row.inputs.get("timestamps"):
        ids.append(special(tokenizer, "notimestamps"))
    return ids


def reference_language(served: Served, row: Row, audio: np.ndarray) -> str:
    """transformers' detect_language on the merged weights."""
    from tests.reference.whisper import _load_model

    adapter = adapter_dir(served, row.adapter)
    model = _load_model(str(served.model_dir), None if adapter is None else str(adapter))
    with torch.inference_mode():
        [token] = model.detect_language(reference_features(str(served.model_dir), audio)).tolist()
    return served.tokenizer.convert_ids_to_tokens(token).strip("<|>")


def check_rows(served: Served, rows: list[Row], audios: dict, english_only=False) -> list[str]:
    """Serve the rows as one batch; compare each with the reference. Returns the languages."""
    started = time.monotonic()
    results = served.transcribe(rows, audios)
    print(f"\n{len(rows)} rows in one batch: {time.monotonic() - started:.1f} s")
    problems = []
    worst = 0.0
    for row, (tokens, logprobs, language, _) in zip(rows, results, strict=True):
        if english_only:
            expected_language = "en"
        elif "language" in row.inputs:
            expected_language = NAMED.get(row.inputs["language"], row.inputs["language"])
        else:
            expected_language = reference_language(served, row, audios[row.audio])
        prompt_language = None if english_only else expected_language
        expected, expected_logprobs = reference_generate(
            served.model_dir,
            adapter_dir(served, row.adapter),
            audios[row.audio],
            reference_prompt(served.tokenizer, row, prompt_language),
            MAX_TOKENS,
        )
        # With timestamps a window may be followed by the one its last segment seeks to; the
        # reference decodes the first window.
        got = tokens[: len(expected)] if row.inputs.get("timestamps") else tokens
        if (got, language) != (expected, expected_language):
            problems.append(
                f"{row.label}: served {tokens} ({language}), reference {expected} "
                f"({expected_language})"
            )
            continue
        # Log-probabilities too: an adapter that moves them without changing a greedy choice
        # (the real model's cross_kv one) would otherwise pass unapplied.
        n = min(LOGPROB_TOKENS, len(expected))
        diff = float(np.max(np.abs(np.subtract(logprobs[:n], expected_logprobs[:n]))))
        worst = max(worst, diff)
        if diff > LOGPROB_TOLERANCE:
            problems.append(f"{row.label}: log-probability differs by {diff:.1e}")
    print(f"max |log-probability difference| {worst:.1e}")
    assert not problems, "\n".join(problems)
    return [language for _, _, language, _ in results]


def test_adapters_change_the_references(demo_models, speech):
    """Guards both matrices against passing vacuously: every kind changes the merged output
    (its tokens, or its log-probabilities, which the matrices compare too)."""
    for model, audio in (
        ("whisper-tiny.en", load_16k(speech("The quick brown fox jumps over the lazy dog."))),
        ("whisper-v3-shape", synthetic_audio(1)),
    ):
        base_dir = demo_models / model
        tokenizer = AutoTokenizer.from_pretrained(base_dir)
        language = None if model.endswith(".en") else "yue"
        prompt = reference_prompt(tokenizer, Row(None, ""), language)
        base, base_logprobs = reference_generate(base_dir, None, audio, prompt, MAX_TOKENS)
        for kind in KINDS:
            adapted, logprobs = reference_generate(
                base_dir, demo_models / f"{model}-adapters" / kind, audio, prompt, MAX_TOKENS
            )
            n = min(LOGPROB_TOKENS, len(base), len(adapted))
            moved = float(np.max(np.abs(np.subtract(logprobs[:n], base_logprobs[:n]))))
            print(f"\n{model} {kind}: tokens changed {adapted != base}, logprobs moved {moved:.2f}")
            assert adapted != base or moved > ADAPTER_EFFECT, f"{model}: {kind} changes nothing"


@pytest.fixture(scope="module")
def tiny_en(demo_models, tmp_path_factory):
    served = Served(
        demo_models / "whisper-tiny.en",
        demo_models / "whisper-tiny.en-adapters",
        tmp_path_factory.mktemp("tiny_en"),
    )
    yield served
    served.close()


def test_tiny_en_every_adapter_kind_in_a_mixed_batch(tiny_en, speech):
    audios = {
        "fox": load_16k(speech("The quick brown fox jumps over the lazy dog.")),
        "ticket": load_16k(speech("How much does a return ticket to Edinburgh cost?", "en-gb")),
    }
    rows = [
        Row(None, "fox"),
        *(Row(kind, "fox") for kind in KINDS),
        *(Row(kind, "ticket", {"language": "english"}) for kind in (None, *KINDS)),
        Row("all_layers", "ticket", {"prompt": "Travel questions."}),
        Row("cross_kv", "fox", {"timestamps": True}),
        Row(None, "ticket", {"timestamps": True, "prompt": "Travel questions."}),
    ]
    check_rows(tiny_en, rows, audios, english_only=True)


@pytest.fixture(scope="module")
def v3_shape(demo_models, tmp_path_factory, tiny_en):
    tiny_en.close()  # one engine at a time
    served = Served(
        demo_models / "whisper-v3-shape",
        demo_models / "whisper-v3-shape-adapters",
        tmp_path_factory.mktemp("v3_shape"),
    )
    yield served
    served.close()


def test_v3_shape_every_mode_and_adapter_kind_in_a_mixed_batch(v3_shape):
    assert len(v3_shape.tokenizer) == 51_866 and v3_shape.task.model.languages["yue"] == 50_358
    audios = {f"audio{seed}": synthetic_audio(seed) for seed in (1, 2, 3)}
    modes = [
        {"language": "cantonese"},  # openai-whisper's name for yue
        {"language": "yue", "task": "translate"},
        {},  # detected
        {"language": "de", "prompt": "Guten Morgen, alle zusammen."},
        {"language": "yue", "timestamps": True},
    ]
    rows = [
        Row(kind, f"audio{1 + i % 3}", mode)
        for i, (kind, mode) in enumerate((k, m) for k in (None, *KINDS) for m in modes)
    ]
    languages = check_rows(v3_shape, rows, audios)
    detected = [lang for row, lang in zip(rows, languages, strict=True) if not row.inputs]
    assert detected[0] == "yue"  # the base model detects Cantonese (by construction)


def test_v3_shape_accepts_cantonese_by_name(v3_shape):
    [job] = v3_shape.task.build_plan(request(audio=synthetic_audio(1), language="Cantonese")).jobs
    assert job.language == "yue" and job.prompts.task_ids[1] == 50_358


# openai-whisper's transcribe() options our word rows match: one temperature (no fallback), no
# no-speech skip, its 224-token sample_len; the refinement (ours only) off.
WORDS_SAMPLING = {
    "temperature": 0.0,
    "no_speech_threshold": None,
    "max_tokens": 224,
    "word_timestamps": True,
    "word_timestamps_refine": False,
}
FRAME_S = 0.02  # one encoder frame: the e2e word test's tolerance


def test_v3_shape_word_timestamps_equal_openai_whisper(v3_shape, request, tmp_path):
    """Every adapter kind in one batch: the first window's segments and words equal openai-
    whisper's transcribe(word_timestamps=True) on the merged float32 weights (cleared segments
    and times past the audio included). Later windows are left out: this random model's
    near-uniform choices follow feature differences there (openai-whisper cuts a later window's
    mel from the whole recording's, we compute it from the window's samples; it also decodes
    tails under 0.1 s), which a trained model does not (tests/e2e/test_whisper_word_timestamps
    checks two windows on whisper-base)."""
    from tests.openai_whisper import install_reference_env, reference_transcribe
    from tests.openai_whisper.convert import convert

    audios = {"short": synthetic_audio(2)}
    rows = [Row(kind, "short", {"language": "yue", "timestamps": True}) for kind in (None, *KINDS)]
    results = v3_shape.transcribe(rows, audios, WORDS_SAMPLING)

    install_reference_env(request)
    checkpoints = {
        kind: convert(v3_shape.model_dir, adapter_dir(v3_shape, kind), tmp_path / f"{kind}.pt")
        for kind in {row.adapter for row in rows}
    }
    options = {"language": "yue", "task": "transcribe", "temperature": 0.0}
    options["no_speech_threshold"] = None
    references = reference_transcribe(
        [(checkpoints[row.adapter], audios[row.audio], options) for row in rows]
    )
    problems, worst, counted, cleared = [], 0.0, 0, 0
    for row, (*_, job), reference in zip(rows, results, references, strict=True):
        first = [s for s in reference["segments"] if s["seek"] == 0]
        cleared += sum(not s["text"] for s in first)
        theirs = [s for s in first if s["text"]]  # openai-whisper blanks the cleared ones
        ours = job.segments[: len(theirs)]
        pairs = list(zip(ours, theirs, strict=False))
        words = [(a, b) for x, y in pairs for a, b in zip(x["words"], y["words"], strict=False)]
        if [s["text"] for s in ours] != [s["text"].strip() for s in theirs] or [
            w["word"] for s in ours for w in s["words"]
        ] != [w["word"] for s in theirs for w in s["words"]]:
            problems.append(f"{row.label}: served {ours}\nopenai-whisper {theirs}")
            continue
        for a, b in pairs + words:
            worst = max(worst, abs(a["start"] - b["start"]), abs(a["end"] - b["end"]))
        counted += len(words)
    print(f"\n{counted} words, {cleared} cleared segments, max |time difference| {worst:.3f} s")
    assert not problems, "\n".join(problems)
    assert counted and worst <= FRAME_S + 1e-6
