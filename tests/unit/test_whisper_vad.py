"""Voice activity detection (whisper_vad): option checks, chunk packing, time mapping back to
the original recording, and Silero VAD itself on espeak-ng speech around a long silence.

A fake engine stream stands in for vLLM only where the task's own flow is tested (what the
engine hears, where the segment times land).
"""

import json

import numpy as np
import pytest

from lora_serving.errors import ConfigError, InvalidRequest
from lora_serving.jobs import GenerationChunk
from lora_serving.sampling import parse_sampling_parameters
from lora_serving.tasks import whisper_options
from lora_serving.tasks.whisper_vad import SpeechDetector, SpeechMap, VadOptions, speech_windows
from tests.conftest import load_16k
from tests.unit.engine_stand_in import run_job
from tests.unit.test_transcription import EN, TRANSCRIBE, TS, request

RATE = 16000
VOCAB = 51865
S = RATE  # one second in samples


def parse(params: dict) -> dict:
    sampling, _ = parse_sampling_parameters(
        json.dumps(params),
        defaults=whisper_options.DEFAULTS,
        max_tokens_limit=440,
        task_fields=whisper_options.task_fields(VOCAB),
    )
    return sampling


# ---- options -------------------------------------------------------------------------------
def test_vad_is_off_by_default_and_parameters_take_faster_whisper_defaults():
    assert parse({})["vad_filter"] is False
    given = parse({"vad_filter": "true", "vad_parameters": {"threshold": 0.6, "speech_pad_ms": 0}})
    assert given["vad_filter"] is True
    options = VadOptions.from_dict(given["vad_parameters"])
    assert options == VadOptions(threshold=0.6, speech_pad_ms=0)
    assert VadOptions() == VadOptions(0.5, None, 0, float("inf"), 2000, 400)  # faster-whisper's


@pytest.mark.parametrize(
    "params, named",
    [
        ({"vad_filter": "sometimes"}, "'vad_filter' must be true or false"),
        ({"vad_parameters": {"threshold": 1.5}}, "'vad_parameters' must be"),
        ({"vad_parameters": {"threshold": 0}}, '{"threshold": 0}'),
        ({"vad_parameters": {"treshold": 0.5}}, '{"treshold": 0.5}'),
        ({"vad_parameters": {"neg_threshold": 0.6}}, "0 <= x <= threshold"),
        ({"vad_parameters": {"speech_pad_ms": -1}}, "'vad_parameters' must be"),
        ({"vad_parameters": {"min_silence_duration_ms": True}}, "'vad_parameters' must be"),
        ({"vad_parameters": {"max_speech_duration_s": 0}}, "max_speech_duration_s (a number > 0)"),
        ({"vad_parameters": [0.5]}, "'vad_parameters' must be an object"),
    ],
)
def test_bad_vad_values_are_refused_naming_the_key(params, named):
    with pytest.raises(InvalidRequest) as err:
        parse(params)
    assert named in str(err.value)


def test_model_json_sets_the_default_and_its_values_are_checked():
    task = {"decoding": {"vad_filter": True, "vad_parameters": {"min_silence_duration_ms": 500}}}
    defaults = whisper_options.decoding_defaults(task, VOCAB, source="model.json")
    assert defaults["vad_filter"] is True
    assert defaults["vad_parameters"] == {"min_silence_duration_ms": 500}
    with pytest.raises(ConfigError, match="serving.task.decoding.vad_parameters must be"):
        bad = {"decoding": {"vad_parameters": {"speech_pad_ms": "400"}}}
        whisper_options.decoding_defaults(bad, VOCAB, source="model.json")


# ---- time mapping and windows --------------------------------------------------------------
# Kept: 1-3 s, 10-12 s, 12-14 s (touching), 40-41 s -> joined 0-2, 2-4, 4-6, 6-7 s.
CHUNKS = [(1 * S, 3 * S), (10 * S, 12 * S), (12 * S, 14 * S), (40 * S, 41 * S)]


@pytest.mark.parametrize(
    "joined_s, is_end, original_s",
    [
        (0.0, False, 1.0),
        (1.5, False, 2.5),
        (2.0, False, 10.0),  # a start on a border belongs to the next chunk
        (2.0, True, 3.0),  # an end on a border to the chunk it ends
        (3.99, False, 11.99),
        (4.0, True, 12.0),  # touching chunks: no silence dropped between them
        (4.0, False, 12.0),
        (6.5, True, 40.5),
        (7.0, True, 41.0),
        (7.5, True, 41.5),  # past the last chunk: the last chunk's shift
    ],
)
def test_joined_speech_times_map_back_to_the_original_recording(joined_s, is_end, original_s):
    assert SpeechMap(CHUNKS).original_time(joined_s, is_end=is_end) == original_s


def test_segments_are_restored_in_place():
    segments = [
        {"start": 0.5, "end": 2.0, "text": "a"},
        {"start": 1.8, "end": 3.0, "text": "spans the dropped silence"},
        {"start": 6.0, "end": 7.0, "text": "b"},
    ]
    SpeechMap(CHUNKS).restore(segments)
    assert [(s["start"], s["end"]) for s in segments] == [(1.5, 3.0), (2.8, 11.0), (40.0, 41.0)]


def test_speech_is_packed_into_windows_of_at_most_30_s_cut_between_chunks():
    samples = np.arange(100 * S, dtype=np.float32)
    chunks = [(0, 12 * S), (20 * S, 35 * S), (50 * S, 52 * S), (60 * S, 90 * S)]
    windows = speech_windows(samples, chunks)
    # 12 + 15 = 27 s; + 2 s = 29 s fits; the 30 s chunk gets a window of its own.
    assert [w.offset_s for w in windows] == [0.0, 60.0]
    assert [w.duration_s for w in windows] == [29.0, 30.0]
    first = windows[0].samples
    assert first[12 * S] == samples[20 * S] and first[27 * S] == samples[50 * S]
    assert windows[1].samples[0] == samples[60 * S]


def test_a_speech_chunk_longer_than_a_window_is_cut_at_its_quietest_moment():
    rng = np.random.default_rng(0)
    samples = (0.1 * rng.standard_normal(80 * S)).astype(np.float32)
    samples[int(34.4 * S) : int(34.6 * S)] = 0.0  # a pause 29.4-29.6 s into the chunk
    windows = speech_windows(samples, [(5 * S, 45 * S), (50 * S, 55 * S)])
    # The 40 s chunk: 5 s -> its pause; the rest (~10.5 s) shares a window with the next chunk.
    assert len(windows) == 2 and windows[0].offset_s == 5.0
    assert 34.4 <= windows[1].offset_s <= 34.6
    assert windows[0].duration_s + windows[1].duration_s == 40 + 5


# ---- Silero VAD on real speech -------------------------------------------------------------
FIRST = "The quick brown fox jumps over the lazy dog."
SECOND = "She opened the window and listened."
GAP_S = 20.0


def voiced_span(samples: np.ndarray) -> tuple[float, float]:
    """Where espeak-ng's voice is in its clip (it pads with a little silence), in seconds."""
    loud = np.flatnonzero(np.abs(samples) > 0.02)
    return loud[0] / RATE, (loud[-1] + 1) / RATE


@pytest.fixture(scope="module")
def speech_and_silence(speech):
    """FIRST, 20 s of silence, SECOND -> (samples, [(start_s, end_s) of each voice])."""
    first, second = load_16k(speech(FIRST)), load_16k(speech(SECOND))
    samples = np.concatenate([first, np.zeros(int(GAP_S * RATE), np.float32), second])
    shift = (len(first) / RATE) + GAP_S
    (a0, a1), (b0, b1) = voiced_span(first), voiced_span(second)
    return samples, [(a0, a1), (b0 + shift, b1 + shift)]


@pytest.fixture(scope="module")
def detector():
    return SpeechDetector()


def test_silero_finds_the_two_sentences_and_drops_the_silence(detector, speech_and_silence):
    samples, voices = speech_and_silence
    chunks = detector.speech_chunks(samples, VadOptions())
    assert len(chunks) == 2
    for (start, end), (voice_start, voice_end) in zip(chunks, voices, strict=True):
        # faster-whisper's 400 ms of padding each side (within the recording), give or take
        # Silero's 32 ms frames.
        assert abs(start / RATE - max(0.0, voice_start - 0.4)) < 0.25
        assert abs(end / RATE - min(len(samples) / RATE, voice_end + 0.4)) < 0.25
    assert detector.speech_chunks(np.zeros(10 * RATE, np.float32), VadOptions()) == []


def test_one_silence_shorter_than_min_silence_keeps_one_chunk(detector, speech_and_silence):
    samples, _ = speech_and_silence
    long_pause = VadOptions(min_silence_duration_ms=25_000)
    assert len(detector.speech_chunks(samples, long_pause)) == 1


# ---- the task's flow (a fake engine stream) -------------------------------------------------
@pytest.fixture(scope="module")
def task(demo_models, tmp_path_factory):
    from transformers import AutoTokenizer

    from lora_serving.adapters.catalog import AdapterCatalog
    from lora_serving.settings import EngineSettings
    from lora_serving.tasks.transcription import TranscriptionTask

    model = demo_models / "whisper-base"
    settings = EngineSettings.from_dict(
        {"model": str(model), "max_model_len": 448},
        model_dir=tmp_path_factory.mktemp("whisper"),
    )
    catalog = AdapterCatalog.from_multi_lora_json(None, enabled=False, max_lora_rank=8)
    return TranscriptionTask(settings, catalog, AutoTokenizer.from_pretrained(model))


def run(job, stream, generate=None) -> list[GenerationChunk]:
    return run_job(job, stream, generate)


# One temperature, no no-speech probe: the stand-in engine answers decoding requests only.
VAD_ON = json.dumps({"vad_filter": True, "temperature": 0, "no_speech_threshold": None})


def test_timestamps_of_the_joined_speech_land_on_the_original_voices(task, speech_and_silence):
    samples, voices = speech_and_silence
    raw = request(audio=samples, language="en", timestamps=True, sampling_parameters=VAD_ON)
    job = task.build_plan(raw).jobs[0]
    heard = []
    hello = task.tokenizer.encode(" Hello.", add_special_tokens=False)
    bye = task.tokenizer.encode(" Bye.", add_special_tokens=False)

    def joined_ts(chunk: int, original_s: float) -> int:
        """The timestamp token at an original time inside kept chunk `chunk`."""
        kept = job.speech.chunks
        before = sum(end - start for start, end in kept[:chunk]) / RATE
        return TS + round((before + original_s - kept[chunk][0] / RATE) / 0.02)

    async def stream(prompt, sampling):
        # The engine finds each sentence where it is in the joined speech it hears.
        heard.append(len(prompt["encoder_prompt"]["multi_modal_data"]["audio"][0]) / RATE)
        (a0, a1), (b0, b1) = voices
        tokens = [joined_ts(0, a0), *hello, joined_ts(0, a1)]
        tokens += [joined_ts(1, b0), *bye, joined_ts(1, b1)]
        yield GenerationChunk("", "", tokens, [], 3, "stop")

    chunks = run(job, stream)
    kept_s = sum(end - start for start, end in job.speech.chunks) / RATE
    assert heard == [pytest.approx(kept_s)] and kept_s < 12  # 20 s of silence not heard
    assert decoder_prompt_ok(job)
    segments = json.loads(task.render(job, chunks[-1], stream=False)["segments"])
    assert [s["text"] for s in segments] == ["Hello.", "Bye."]
    for segment, (voice_start, voice_end) in zip(segments, voices, strict=True):
        assert abs(segment["start"] - voice_start) <= 0.02  # one timestamp step
        assert abs(segment["end"] - voice_end) <= 0.02


def decoder_prompt_ok(job) -> bool:
    return job.prompts.task_ids[1:3] == [EN, TRANSCRIBE]


def test_plain_text_hears_speech_windows_and_no_speech_needs_no_engine(task, speech_and_silence):
    samples, _ = speech_and_silence
    raw = request(audio=samples, sampling_parameters=VAD_ON)  # language detected on the speech
    job = task.build_plan(raw).jobs[0]
    detected_on, heard = [], []

    async def generate(prompt, sampling):
        detected_on.append(len(prompt["encoder_prompt"]["multi_modal_data"]["audio"][0]) / RATE)
        return GenerationChunk("", "", [EN], [], 1, "length")

    async def stream(prompt, sampling):
        heard.append(len(prompt["encoder_prompt"]["multi_modal_data"]["audio"][0]) / RATE)
        yield GenerationChunk(" Words.", "", [1], [], 3, "stop")

    chunks = run(job, stream, generate)
    kept = job.speech.chunks
    assert len(kept) == 2 and heard == [pytest.approx(sum(e - s for s, e in kept) / RATE)]
    assert detected_on == heard and job.language == "en"
    assert chunks[-1].text == "Words."

    silent = request(audio=np.zeros(5 * RATE, np.float32), sampling_parameters=VAD_ON)
    job = task.build_plan(silent).jobs[0]

    async def refuse(prompt, sampling):
        raise AssertionError("no engine request for a recording without speech")
        yield

    (final,) = run(job, refuse, refuse)
    assert final.finished and final.text == ""
    assert task.render(job, final, stream=False)["segments"] == "[]"
