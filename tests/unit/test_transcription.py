"""TranscriptionTask without an engine: request rows -> window prompts, errors, outputs.

A fake engine stream stands in for vLLM only to test our own stitching and ordering.
"""

import asyncio
import functools
import io
import json

import numpy as np
import pytest
import soundfile

from lora_serving.adapters.catalog import AdapterCatalog
from lora_serving.errors import InvalidRequest
from lora_serving.jobs import GenerationChunk
from lora_serving.request_inputs import RawRequest
from lora_serving.settings import EngineSettings
from lora_serving.tasks.transcription import TranscriptionTask
from lora_serving.tasks.whisper_logits import EXTRA_ARG
from tests.unit.engine_stand_in import StandInEngine, run_job

SOT, SOT_PREV, EN, DE, TRANSCRIBE, NO_TS, TS = 50258, 50361, 50259, 50261, 50359, 50363, 50364
EOT = 50257


@pytest.fixture(scope="module")
def task(demo_models, tmp_path_factory):
    from transformers import AutoTokenizer

    model = demo_models / "whisper-base"
    settings = EngineSettings.from_dict(
        {"model": str(model), "max_model_len": 448, "serving": {"task": {"max_audio_seconds": 90}}},
        model_dir=tmp_path_factory.mktemp("whisper"),
    )
    catalog = AdapterCatalog.from_multi_lora_json(None, enabled=False, max_lora_rank=8)
    return TranscriptionTask(settings, catalog, AutoTokenizer.from_pretrained(model))


def task_model_dir(task):
    from pathlib import Path

    return Path(task.reader.settings.engine_args["model"])


def request(**inputs) -> RawRequest:
    """One batch row per input (shape [1, ...]), as Triton hands them to the model."""
    tensors = {}
    for name, value in inputs.items():
        if isinstance(value, np.ndarray):
            tensors[name] = value[None, ...]
        elif isinstance(value, bool):
            tensors[name] = np.array([[value]])
        elif isinstance(value, int):
            tensors[name] = np.array([[value]], np.int32)
        else:
            tensors[name] = np.array(
                [[value.encode() if isinstance(value, str) else value]], object
            )
    return RawRequest(tensors)


def tone(seconds: float, rate=16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def decoder_ids(task, job) -> list[int]:
    prompt, _ = job_request(task, job)
    return prompt["decoder_prompt"]["prompt_token_ids"]


def job_request(task, job, seconds=1.0):
    """The engine request the task makes for a window of the row's audio."""
    return task.request_for(job, job.samples[: int(seconds * 16000)])


def test_prompt_follows_whisper_with_language_given(task):
    job = task.build_plan(request(audio=tone(2), language="EN")).jobs[0]
    assert decoder_ids(task, job) == [SOT, EN, TRANSCRIBE, NO_TS]
    assert job.language == "en" and job.prompts is not None  # no detection
    prompt, sampling = job_request(task, job)
    assert prompt["encoder_prompt"]["multi_modal_data"]["audio"][1] == 16000
    rules = sampling.pop("extra_args")[EXTRA_ARG]
    # The chosen tokens' log-probabilities feed the quality checks (whisper_quality).
    assert sampling == {"temperature": 0.0, "max_tokens": 128, "logprobs": 0}
    # By default the model's generation_config suppression, as openai-whisper and transformers.
    config = json.loads(((task_model_dir(task)) / "generation_config.json").read_text())
    assert rules["suppress"] == sorted(config["suppress_tokens"])
    assert rules["suppress_at_begin"] == config["begin_suppress_tokens"] == [220, EOT]
    assert rules["timestamps"] is None


def test_suppression_can_be_turned_off_or_extended_per_request(task):
    off = json.dumps({"suppress_tokens": [], "suppress_blank": False})
    job = task.build_plan(request(audio=tone(2), language="en", sampling_parameters=off)).jobs[0]
    assert "extra_args" not in job_request(task, job)[1]
    more = json.dumps({"suppress_tokens": [1234]})
    job = task.build_plan(request(audio=tone(2), language="en", sampling_parameters=more)).jobs[0]
    assert 1234 in job_request(task, job)[1]["extra_args"][EXTRA_ARG]["suppress"]


def test_timestamps_leave_out_notimestamps_and_turn_the_rules_on(task):
    job = task.build_plan(request(audio=tone(2), language="de", timestamps=True)).jobs[0]
    assert decoder_ids(task, job) == [SOT, DE, TRANSCRIBE]
    rules = job_request(task, job)[1]["extra_args"][EXTRA_ARG]
    assert rules["timestamps"] == {"timestamp_begin": TS, "eot": 50257}


@pytest.mark.parametrize("prompt_kept", [True, False])
def test_previous_text_keeps_its_last_half_context_and_max_tokens_fits_the_rest(
    task, monkeypatch, prompt_kept
):
    """With our plugin the prompt reaches Whisper as given; without it vLLM puts one more
    <|startoftranscript|> in front, and max_tokens leaves room for it."""
    from lora_serving.vllm_plugin import whisper_decoder_prompt

    monkeypatch.setattr(whisper_decoder_prompt, "applied", lambda: prompt_kept)
    monkeypatch.setattr(task.model, "_decoder_prompt_kept", None)  # asked again
    prompt = " ".join(["word"] * 400)
    sampling = json.dumps({"max_tokens": 400})
    job = task.build_plan(
        request(audio=tone(2), language="en", prompt=prompt, sampling_parameters=sampling)
    ).jobs[0]
    ids = decoder_ids(task, job)
    assert ids[0] == SOT_PREV and ids[-4:] == [SOT, EN, TRANSCRIBE, NO_TS]
    assert len(ids) == 1 + 223 + 4
    # 448 positions: the prompt (+ vLLM's own <|startoftranscript|>), then the output.
    assert job_request(task, job)[1]["max_tokens"] == 448 - len(ids) - (not prompt_kept)


@pytest.mark.parametrize(
    "language, code, token",
    [("Javanese", "jw", 50356), ("haw", "haw", 50352), ("german", "de", DE)],
)
def test_every_whisper_language_is_requested_by_code_or_name(task, language, code, token):
    job = task.build_plan(request(audio=tone(2), language=language)).jobs[0]
    assert job.language == code
    assert decoder_ids(task, job) == [SOT, token, TRANSCRIBE, NO_TS]


def test_language_absent_or_blank_is_detected_from_the_first_30_s(task):
    for raw in (request(audio=tone(2)), request(audio=tone(2), language=" ")):
        job = task.build_plan(raw).jobs[0]
        assert job.language is None and job.prompts is None  # detected when it runs

    job = task.build_plan(request(audio=tone(70))).jobs[0]
    seen = []

    async def generate(prompt, sampling):
        seen.append((prompt, sampling))
        return GenerationChunk("", "", [DE], [], 1, "length")

    asyncio.run(job.detect_language(StandInEngine(generate=generate)))
    ((prompt, sampling),) = seen
    assert prompt["decoder_prompt"]["prompt_token_ids"] == [SOT]
    assert len(prompt["encoder_prompt"]["multi_modal_data"]["audio"][0]) == 30 * 16000
    assert sampling["max_tokens"] == 1 and EN in sampling["allowed_token_ids"]
    # Every language token the model has (openai-whisper's detect_language), not only ISO 639-1.
    assert sorted(sampling["allowed_token_ids"]) == list(range(EN, EN + 99))
    assert job.language == "de"
    assert decoder_ids(task, job) == [SOT, DE, TRANSCRIBE, NO_TS]


def test_padded_rows_are_cut_to_their_audio_length(task):
    rows = np.zeros((2, 32000), np.float32)
    rows[0, :16000], rows[1] = tone(1), tone(2)
    raw = RawRequest(
        {
            "audio": rows,
            "audio_length": np.array([[16000], [32000]], np.int32),
            "language": np.array([[b"en"], [b"de"]], object),
        }
    )
    jobs = task.build_plan(raw).jobs
    assert [len(job.samples) for job in jobs] == [16000, 32000]
    assert [job.language for job in jobs] == ["en", "de"]


def wav(samples, rate=22050) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV")
    return buffer.getvalue()


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"audio": np.zeros(0, np.float32)}, "audio is empty"),
        ({"audio": np.array([0.1, np.nan], np.float32)}, "NaN or infinite"),
        ({"audio": np.array([0.1, np.inf], np.float32)}, "NaN or infinite"),
        ({"audio": np.zeros(5, np.int16)}, "must be float32 samples, got int16"),
        ({"audio": np.zeros((2, 5), np.float32)}, "must be 1-D mono samples"),
        ({"audio": tone(1), "audio_file": wav(tone(1))}, "exactly one of 'audio'"),
        ({"language": "en"}, "exactly one of 'audio'"),
        ({"audio_file": b"RIFF not really a wav"}, "audio_file could not be decoded"),
        ({"audio": tone(1), "sample_rate": 0}, "sample_rate must be > 0, got 0"),
        ({"audio": tone(1), "sample_rate": -8000}, "sample_rate must be > 0"),
        ({"audio": tone(1), "audio_length": 16001}, "audio_length 16001 must be in 1..16000"),
        ({"audio": tone(91)}, "longer than the 90 s limit"),
        ({"audio_file": wav(tone(91, 8000), 8000)}, "longer than the 90 s limit"),
        ({"audio": tone(1), "language": "xx"}, "unknown language 'xx'"),
        ({"audio": tone(1), "task": "summarize"}, "unknown task 'summarize'"),
        ({"audio": tone(1), "sampling_parameters": "{max_tokens: 3"}, "not valid JSON"),
        ({"audio": tone(1), "sampling_parameters": '{"max_tokens": "3.5"}'}, "'max_tokens' must"),
        ({"audio": tone(1), "sampling_parameters": '{"max_tokens": 0}'}, "an integer > 0, got 0"),
        ({"audio": tone(1), "sampling_parameters": '{"max_tokens": 500}'}, "at most 440"),
        ({"audio": tone(1), "sampling_parameters": "[1]"}, "must be a JSON object"),
        ({"audio": tone(1), "timestamps": 1}, "'timestamps' must be TYPE_BOOL"),
        ({"audio": tone(1), "lora_name": "alpha"}, "LoRA is disabled"),
    ],
)
def test_bad_rows_are_named(task, inputs, message):
    with pytest.raises(InvalidRequest, match=message):
        task.build_plan(request(**inputs))


def test_payload_over_the_limit_is_refused(task, monkeypatch):
    monkeypatch.setattr(task.requests, "max_payload_bytes", 1000)
    with pytest.raises(InvalidRequest, match="'audio' holds 64000 bytes; at most 1000"):
        task.build_plan(request(audio=tone(1)))


def window_start(job, prompt) -> float:
    """Where the window an engine request is for starts in the row's audio (seconds)."""
    window = prompt["encoder_prompt"]["multi_modal_data"]["audio"][0]
    row = job.samples
    assert np.shares_memory(window, row)  # windows are views of the row's samples
    return (window.ctypes.data - row.ctypes.data) / row.itemsize / 16000


# One temperature and no no-speech probe: one engine request per window, streamed live.
SINGLE_PASS = json.dumps({"temperature": 0, "no_speech_threshold": None})


def fake_stream(job, outputs: dict[int, list[str]], delays: dict[int, float]):
    """An engine stand-in: window i (starting near i * 30 s) streams outputs[i] cumulatively."""

    async def stream(prompt, sampling):
        index = round(window_start(job, prompt) / 30)
        texts = outputs[index]
        for step, text in enumerate(texts):
            await asyncio.sleep(delays[index])
            done = step == len(texts) - 1
            yield GenerationChunk(text, "", [index] * (step + 1), [], 4, "stop" if done else None)

    return stream


def run_decode(job, stream) -> list[GenerationChunk]:
    """The job's chunks; the stand-in engine answers its window requests (its language is
    known: no preparing request)."""
    return run_job(job, stream)


@pytest.mark.parametrize(
    "delays, deltas",
    [
        # In recording order: each window's text streams as it is decoded.
        ({0: 0.0, 1: 0.01, 2: 0.02}, ["One", " two.", " Three", " four.", " Five."]),
        # Last window first: windows 2 and 3 wait for window 1, then follow its text at once.
        ({0: 0.03, 1: 0.01, 2: 0.0}, ["One", " two. Three four. Five."]),
    ],
)
def test_windows_stream_in_recording_order_and_add_up_to_the_final_text(task, delays, deltas):
    job = task.build_plan(
        request(audio=tone(70), language="en", sampling_parameters=SINGLE_PASS)
    ).jobs[0]  # ~29 s, 29 s, 12 s
    outputs = {0: [" One", " One two."], 1: [" Three", " Three four."], 2: ["", " Five."]}
    chunks = run_decode(job, fake_stream(job, outputs, delays))
    final = chunks[-1]
    assert final.finished and final.text == "One two. Three four. Five."
    assert [chunk.delta for chunk in chunks] == deltas
    assert final.token_ids == [0, 0, 1, 1, 2, 2] and final.num_prompt_tokens == 12
    rendered = task.render(job, final, stream=False)
    assert rendered == {"text_output": final.text, "language": "en", "segments": "[]"}


def test_timestamps_seek_to_where_the_last_complete_segment_ended(task):
    """openai-whisper's long form: an unfinished sentence is heard again in the next window."""
    encode = functools.partial(task.tokenizer.encode, add_special_tokens=False)
    hello, bye, nothing = encode(" Hello there."), encode(" Bye."), []
    by_start = {  # window start (s) -> its output tokens, decoded one token per step
        0.0: [TS, *hello, TS + 100, TS + 110, *bye[:1], EOT],  # " Bye" cut by the window edge
        2.0: [TS + 10, *bye, TS + 60, EOT],  # ends on a closed segment: all of it is said
        32.0: [TS, *nothing, EOT],
    }
    starts = []

    async def stream(prompt, sampling):
        start = round(window_start(job, prompt), 2)
        starts.append(start)
        for step in range(1, len(by_start[start]) + 1):
            done = step == len(by_start[start])
            tokens = by_start[start][:step]
            yield GenerationChunk("", "", tokens, [-0.25] * step, 3, "stop" if done else None)

    job = task.build_plan(
        request(audio=tone(45), language="en", timestamps=True, sampling_parameters=SINGLE_PASS)
    ).jobs[0]
    chunks = run_decode(job, stream)
    assert starts == [0.0, 2.0, 32.0]  # 2.0: where the last complete segment ended
    assert [chunk.delta for chunk in chunks] == ["Hello there.", " Bye.", ""]
    rendered = task.render(job, chunks[-1], stream=False)
    assert rendered["text_output"] == "Hello there. Bye."
    # The window's accepted attempt (the stand-in engine gives no text: ratio 0).
    quality = {
        "temperature": 0.0,
        "avg_logprob": -0.25,
        "compression_ratio": 0.0,
        "no_speech_prob": None,
    }
    assert json.loads(rendered["segments"]) == [
        {"start": 0.0, "end": 2.0, "text": "Hello there.", **quality},
        # No two timestamps in a row: one segment from the window's start, as openai-whisper
        # reads it (transcribe.py's `start=time_offset`), not from its <|0.20|>.
        {"start": 2.0, "end": 3.2, "text": "Bye.", **quality},
    ]


def test_a_failing_window_fails_the_row_and_cancels_the_others(task):
    job = task.build_plan(
        request(audio=tone(65), language="en", sampling_parameters=SINGLE_PASS)
    ).jobs[0]
    cancelled = []

    async def stream(prompt, sampling):
        seconds = len(prompt["encoder_prompt"]["multi_modal_data"]["audio"][0]) / 16000
        if seconds < 10:
            raise InvalidRequest("window refused")
        try:
            await asyncio.sleep(10)
            yield GenerationChunk("never", "", [], [], 0, "stop")
        except asyncio.CancelledError:
            cancelled.append(seconds)
            raise

    with pytest.raises(InvalidRequest, match="window refused"):
        run_decode(job, stream)
    assert len(cancelled) == 2


# ---- hotwords and prefix (faster-whisper's get_prompt) ------------------------------------------
def words(task, text: str) -> list[int]:
    return task.tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize(
    "options, prompt, expected",
    [
        ({"hotwords": "  Zyprexa Xanax "}, None, ["prev", "hot", "task"]),
        ({"hotwords": "Zyprexa Xanax"}, "Birds and foxes.", ["prev", "hot", "previous", "task"]),
        ({"prefix": "The quick"}, None, ["task", "prefix"]),
        # faster-whisper: "Has no effect if prefix is not None" (in the window that has it)
        ({"prefix": "The quick", "hotwords": "Zyprexa Xanax"}, None, ["task", "prefix"]),
        (
            {"prefix": "The quick", "hotwords": "Zyprexa Xanax"},
            "Birds and foxes.",
            ["prev", "previous", "task", "prefix"],
        ),
        ({"hotwords": "", "prefix": None}, None, ["task"]),
        ({"hotwords": "   "}, None, ["task"]),
    ],
)
def test_hotwords_and_prefix_go_where_faster_whisper_puts_them(task, options, prompt, expected):
    parts = {
        "prev": [SOT_PREV],
        "hot": words(task, " Zyprexa Xanax"),
        "previous": words(task, " Birds and foxes."),
        "task": [SOT, EN, TRANSCRIBE, NO_TS],
        "prefix": words(task, " The quick"),
    }
    inputs = {"audio": tone(2), "language": "en", "sampling_parameters": json.dumps(options)}
    if prompt:
        inputs["prompt"] = prompt
    job = task.build_plan(request(**inputs)).jobs[0]
    assert decoder_ids(task, job) == [i for part in expected for i in parts[part]]


def test_long_hotwords_keep_their_first_half_context(task):
    sampling = json.dumps({"hotwords": " ".join(f"word{i}" for i in range(400))})
    job = task.build_plan(request(audio=tone(2), language="en", sampling_parameters=sampling))
    ids = decoder_ids(task, job.jobs[0])
    hotwords = words(task, " " + " ".join(f"word{i}" for i in range(400)))
    assert ids == [SOT_PREV, *hotwords[:223], SOT, EN, TRANSCRIBE, NO_TS]


def test_the_prefix_starts_the_first_window_only_and_hotwords_the_others(task):
    options = {
        "prefix": "One",
        "hotwords": "Zyprexa",
        "temperature": 0,
        "no_speech_threshold": None,
    }
    job = task.build_plan(
        request(audio=tone(70), language="en", sampling_parameters=json.dumps(options))
    ).jobs[0]  # windows at ~0, 29, 58 s, decoded at once
    prompts = {}

    async def stream(prompt, sampling):
        start = round(window_start(job, prompt) / 30)
        prompts[start] = prompt["decoder_prompt"]["prompt_token_ids"]
        yield GenerationChunk(" x", " x", [1], [], 4, "stop")

    run_decode(job, stream)
    task_ids = [SOT, EN, TRANSCRIBE, NO_TS]
    assert prompts[0] == [*task_ids, *words(task, " One")]
    assert prompts[1] == prompts[2] == [SOT_PREV, *words(task, " Zyprexa"), *task_ids]


def test_hotwords_come_before_the_text_said_in_earlier_windows_with_timestamps(task):
    options = {"hotwords": "Zyprexa", "temperature": 0, "no_speech_threshold": None}
    said = words(task, " Hello there.")
    outputs = [[TS, *said, TS + 100, EOT], [TS, EOT]]
    prompts = []

    async def stream(prompt, sampling):
        prompts.append(prompt["decoder_prompt"]["prompt_token_ids"])
        tokens = outputs[len(prompts) - 1]
        yield GenerationChunk("", "", tokens, [-0.1] * len(tokens), 3, "stop")

    job = task.build_plan(
        request(
            audio=tone(45), language="en", timestamps=True, sampling_parameters=json.dumps(options)
        )
    ).jobs[0]
    run_decode(job, stream)
    hot = [SOT_PREV, *words(task, " Zyprexa")]
    assert prompts[0] == [*hot, SOT, EN, TRANSCRIBE]
    assert prompts[1] == [*hot, TS, *said, TS + 100, SOT, EN, TRANSCRIBE]


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"timestamps": True, "sampling_parameters": '{"prefix": "The"}'}, "'prefix' is not"),
        ({"sampling_parameters": '{"hotwords": 5}'}, "hotwords"),
        ({"sampling_parameters": '{"prefix": ["The"]}'}, "prefix"),
    ],
)
def test_bad_hotwords_or_prefix_are_named(task, inputs, message):
    with pytest.raises(InvalidRequest, match=message):
        task.build_plan(request(audio=tone(2), language="en", **inputs)).jobs[0]


# ---- an English-only model (whisper-tiny.en: the gpt2 vocabulary's layout) -------------------
EN_SOT, EN_SOT_PREV, EN_NO_TS = 50257, 50360, 50362


@pytest.fixture(scope="module")
def english_task(demo_models, tmp_path_factory):
    from transformers import AutoTokenizer

    model = demo_models / "whisper-tiny.en"
    settings = EngineSettings.from_dict(
        {"model": str(model), "max_model_len": 448}, model_dir=tmp_path_factory.mktemp("tiny_en")
    )
    catalog = AdapterCatalog.from_multi_lora_json(None, enabled=False, max_lora_rank=8)
    return TranscriptionTask(settings, catalog, AutoTokenizer.from_pretrained(model))


@pytest.mark.parametrize("language", [None, "en", "English", " EN "])
def test_english_only_prompt_has_no_language_or_task_tokens(english_task, language):
    """As openai-whisper's sot_sequence and transformers' generate() for .en models; English
    is known without detection (no preparing request)."""
    inputs = {"audio": tone(2)} | ({"language": language} if language else {})
    job = english_task.build_plan(request(**inputs)).jobs[0]
    assert job.language == "en" and job.prompts is not None  # no detection
    assert decoder_ids(english_task, job) == [EN_SOT, EN_NO_TS]
    job = english_task.build_plan(request(audio=tone(2), prompt="Hello", timestamps=True)).jobs[0]
    prompt = decoder_ids(english_task, job)
    assert prompt[0] == EN_SOT_PREV and prompt[-1] == EN_SOT  # no <|notimestamps|>


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"language": "de"}, "language 'de' is not available: this model is English-only"),
        ({"language": "german"}, "send 'en' or leave language out"),
        ({"task": "translate"}, "task 'translate' is not available: this model is English-only"),
    ],
)
def test_english_only_model_refuses_other_languages_and_translation(english_task, inputs, message):
    with pytest.raises(InvalidRequest) as refused:
        english_task.build_plan(request(audio=tone(1), **inputs))
    assert message in str(refused.value)
