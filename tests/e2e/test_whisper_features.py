"""whisper_lora's options end to end: timestamps, adapters per row, streaming, previous text,
translation and the command line. References are computed here with transformers on the
adapter-merged weights (tests.reference.whisper), never with the serving code.
"""

import io
import json

import numpy as np
import pytest
import soundfile
from lora_client import cli

from tests.conftest import load_16k
from tests.e2e.triton_calls import grpc_many, grpc_one, http_one, sampling

MODEL = "whisper_lora"
TWO_SENTENCES = "The quick brown fox jumps over the lazy dog. She opened the window and listened."
PREVIOUS = "Birds and foxes."


@pytest.fixture(scope="module")
def clip(speech):
    return speech(TWO_SENTENCES)


@pytest.fixture(scope="module")
def tokenizer(demo_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_models / "whisper-base")


def reference_tokens(demo_models, adapter, wav, prompt_ids, max_tokens=60) -> list[int]:
    """Greedy tokens of the merged-weights reference (PEFT merge, float32)."""
    from tests.reference.whisper import reference_generate

    adapter_dir = demo_models / "whisper-adapters" / adapter if adapter else None
    base = demo_models / "whisper-base"
    tokens, _ = reference_generate(base, adapter_dir, load_16k(wav), prompt_ids, max_tokens)
    return tokens


def transformers_segments(demo_models, adapter, wav) -> list[dict]:
    """transformers' own Whisper timestamp decoding (its WhisperTimeStampLogitsProcessor) with
    the model's generation_config (token suppression on), as whisper_lora decodes by default."""
    from transformers import AutoTokenizer

    from tests.reference.whisper import _load_model, reference_features

    base = str((demo_models / "whisper-base").absolute())
    adapter_dir = str((demo_models / "whisper-adapters" / adapter).absolute()) if adapter else None
    features = reference_features(base, load_16k(wav))
    ids = _load_model(base, adapter_dir).generate(
        features, language="en", task="transcribe", return_timestamps=True
    )[0]
    decoded = AutoTokenizer.from_pretrained(base).decode(
        ids, output_offsets=True, skip_special_tokens=True
    )
    return [
        {"start": round(start, 2), "end": round(end, 2), "text": item["text"].strip()}
        for item in decoded["offsets"]
        for start, end in [item["timestamp"]]
    ]


def test_timestamps_for_adapters_sharing_batches_equal_transformers(grpc_url, clip, demo_models):
    """{base, alpha, beta} with timestamps and {beta, base} without, all sent at once."""
    audio = {"audio_file": clip.read_bytes(), "language": "en"}
    runs = [(None, True), ("alpha", True), ("beta", True), ("beta", False), (None, False)]
    outcomes = grpc_many(
        grpc_url,
        MODEL,
        [({**audio, "timestamps": ts}, {"lora_name": name} if name else None) for name, ts in runs],
    )
    timed = {}
    for (name, with_timestamps), outcome in zip(runs, outcomes, strict=True):
        segments = json.loads(outcome.outputs["segments"][0])
        if with_timestamps:
            # Times and text; each segment also says how its window was decoded.
            timed_text = [{key: s[key] for key in ("start", "end", "text")} for s in segments]
            assert timed_text == transformers_segments(demo_models, name, clip), name
            assert outcome.text == " ".join(segment["text"] for segment in segments)
            timed[name] = timed_text
        else:
            assert segments == []
    assert timed["alpha"] != timed[None]  # the demo adapters move the segment times


def test_rows_of_one_request_take_their_own_adapter(grpc_url, clip, demo_models, tokenizer):
    """The `lora_name` input tensor names each row's adapter (perf_analyzer's way)."""
    rows = [b"", b"alpha", b"beta"]
    fields = {
        "audio_file": np.array([[clip.read_bytes()]] * 3, dtype=object),
        "language": np.array([[b"en"]] * 3, dtype=object),
        "lora_name": np.array([[name] for name in rows], dtype=object),
        "sampling_parameters": np.array([[sampling(max_tokens=40).encode()]] * 3, dtype=object),
    }
    outcome = grpc_one(grpc_url, MODEL, fields)
    assert outcome.error is None, outcome.error
    prompt = tokenizer.convert_tokens_to_ids(
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
    )
    for name, text in zip(rows, outcome.outputs["text_output"], strict=True):
        tokens = reference_tokens(demo_models, name.decode(), clip, prompt, max_tokens=40)
        assert text == tokenizer.decode(tokens, skip_special_tokens=True).strip(), name


def test_every_language_of_the_model_by_code_or_name_equals_the_reference(
    grpc_url, clip, demo_models, tokenizer
):
    """whisper-base's <|haw|>, <|jw|>, <|su|> (not in vLLM's ISO 639-1 list) by code and by
    openai-whisper's names, in one batch, each decoded as the reference decodes its prompt; a
    language the model lacks is refused, naming only the model's own."""
    as_reference = sampling(max_tokens=40, temperature=0, no_speech_threshold=None)
    audio = {"audio_file": clip.read_bytes(), "sampling_parameters": as_reference}
    requested = {"haw": "haw", "Hawaiian": "haw", "javanese": "jw", "su": "su"}
    outcomes = grpc_many(grpc_url, MODEL, [({**audio, "language": r}, None) for r in requested])
    for (name, code), outcome in zip(requested.items(), outcomes, strict=True):
        assert outcome.error is None, outcome.error
        assert outcome.outputs["language"] == [code], name
        prompt = tokenizer.convert_tokens_to_ids(
            ["<|startoftranscript|>", f"<|{code}|>", "<|transcribe|>", "<|notimestamps|>"]
        )
        tokens = reference_tokens(demo_models, None, clip, prompt, max_tokens=40)
        assert outcome.text == tokenizer.decode(tokens, skip_special_tokens=True).strip(), name
    refused = grpc_one(grpc_url, MODEL, {**audio, "language": "cantonese"})
    assert "unknown language 'cantonese'; this model knows 99: af, am, ar," in refused.error
    assert "yue" not in refused.error


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_streamed_text_adds_up_to_the_final_text(grpc_url, http_url, clip, protocol):
    """One temperature streams token by token; the default schedule (which may retry a window)
    releases a window's text once it is accepted."""
    call, url = (grpc_one, grpc_url) if protocol == "grpc" else (http_one, http_url)
    fields = {"audio_file": clip.read_bytes(), "language": "en"}
    whole = call(url, MODEL, fields)
    streamed = call(
        url, MODEL, {**fields, "stream": True, "sampling_parameters": '{"temperature": 0}'}
    )
    assert len(streamed.partials) >= 5
    assert "".join(streamed.partials) == streamed.text == whole.text
    by_window = call(url, MODEL, {**fields, "stream": True})
    assert by_window.partials == [] and by_window.text == whole.text


def generate_with_prompt(demo_models, adapter, wav, previous: str, max_tokens: int) -> str:
    """transformers as its users call it with previous text: generate(prompt_ids=...)."""
    import torch
    from transformers import AutoTokenizer

    from tests.reference.whisper import _load_model, reference_features

    base = str((demo_models / "whisper-base").absolute())
    adapter_dir = str((demo_models / "whisper-adapters" / adapter).absolute()) if adapter else None
    tokenizer = AutoTokenizer.from_pretrained(base)
    features = reference_features(base, load_16k(wav))
    prompt_ids = torch.tensor(tokenizer.get_prompt_ids(previous))
    ids = (
        _load_model(base, adapter_dir)
        .generate(
            features,
            language="en",
            task="transcribe",
            prompt_ids=prompt_ids,
            max_new_tokens=max_tokens,
        )[0]
        .tolist()
    )
    # Some transformers versions return the prompt too: keep what follows the last start token.
    sot = tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    start = len(ids) - ids[::-1].index(sot) if sot in ids else 0
    return tokenizer.decode(ids[start:], skip_special_tokens=True).strip()


def test_previous_text_reaches_whisper_as_it_was_trained(grpc_url, clip, demo_models, tokenizer):
    """`prompt` is decoded as `<|startofprev|> text <|startoftranscript|><|en|>...`, exactly
    transformers' generate(prompt_ids=...) for the base and an adapter sharing a batch; vLLM's
    own extra <|startoftranscript|> in front (upstream issue 53206) would change the text."""
    fields = {
        "audio_file": clip.read_bytes(),
        "language": "en",
        "prompt": PREVIOUS,
        "sampling_parameters": sampling(max_tokens=60),
    }
    base, alpha = grpc_many(grpc_url, MODEL, [(fields, None), (fields, {"lora_name": "alpha"})])
    assert base.text == generate_with_prompt(demo_models, None, clip, PREVIOUS, 60)
    assert alpha.text == generate_with_prompt(demo_models, "alpha", clip, PREVIOUS, 60)
    special = tokenizer.convert_tokens_to_ids
    prefixed = [
        *special(["<|startoftranscript|>", "<|startofprev|>"]),
        *tokenizer.encode(" " + PREVIOUS, add_special_tokens=False),
        *special(["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]),
    ]
    old = reference_tokens(demo_models, None, clip, prefixed)
    assert base.text != tokenizer.decode(old, skip_special_tokens=True).strip()


def test_default_decoding_suppresses_like_transformers_for_every_adapter_kind(
    grpc_url, demo_models, tokenizer
):
    """By default served tokens equal transformers' generate() with the model's generation_config
    (suppress_tokens, begin_suppress_tokens) on the merged weights, for the base and each kind
    of adapter, all in one batch. On a pure tone plain greedy says "(chiming)"; suppression
    forbids "(" and the text changes, exactly as in the reference. With suppression off
    (suppress_tokens [], suppress_blank false) the served text is plain greedy again.
    transformers' generate() applies no quality loop by default, and by openai-whisper's rules
    this tone is no speech at all (test_whisper_decoding): one temperature and no no-speech
    check here, the reference's own decoding."""
    from tests.reference.whisper import greedy_without_rules, reference_generate

    t = np.arange(3 * 16000) / 16000
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    base = demo_models / "whisper-base"
    prompt = tokenizer.convert_tokens_to_ids(
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
    )
    as_reference = {"max_tokens": 20, "temperature": 0, "no_speech_threshold": None}
    fields = {"audio": tone, "language": "en", "sampling_parameters": sampling(**as_reference)}
    off = sampling(**as_reference, suppress_tokens=[], suppress_blank=False)
    adapters = [None, "alpha", "cross_kv", "encoder_only", "all_layers"]
    outcomes = grpc_many(
        grpc_url,
        MODEL,
        [(fields, {"lora_name": name} if name else None) for name in adapters]
        + [({**fields, "sampling_parameters": off}, None)],
    )
    for name, outcome in zip(adapters, outcomes, strict=False):
        adapter_dir = demo_models / "whisper-adapters" / name if name else None
        tokens, _ = reference_generate(base, adapter_dir, tone, prompt, 20)
        expected = tokenizer.decode(tokens, skip_special_tokens=True).strip()
        assert outcome.text.strip() == expected, name
    plain_tokens, _ = greedy_without_rules(base, None, tone, prompt, 20)
    plain = tokenizer.decode(plain_tokens, skip_special_tokens=True).strip()
    # Plain greedy starts with a non-speech symbol ("(" or "[") openai-whisper never emits.
    config = json.loads((base / "generation_config.json").read_text())
    assert plain_tokens[0] in config["suppress_tokens"], plain
    assert outcomes[-1].text.strip() == plain
    assert outcomes[0].text.strip() != plain


def test_translate_german_speech_to_english(grpc_url, speech):
    wav = speech("Guten Morgen. Ich trinke jeden Tag ein Glas Wasser.", voice="de")
    outcome = grpc_one(grpc_url, MODEL, {"audio_file": wav.read_bytes(), "task": "translate"})
    assert outcome.outputs["language"] == ["de"]
    text = outcome.text.lower()
    assert "good morning" in text and "water" in text, text


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_command_line_prints_text_and_segments(grpc_url, http_url, clip, protocol, capsys):
    url = grpc_url if protocol == "grpc" else http_url
    args = ["transcribe", str(clip), "--timestamps", "--language", "en", "--adapter", "beta"]
    assert cli.main([*args, "--url", url, "--protocol", protocol, "--stream"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "lazy dog" in lines[0] and len(lines) == 3
    assert lines[1].startswith("[    0.00 ->") and "lazy dog" in lines[1]
    assert "listened" in lines[2]


def test_resampled_long_samples_and_file_agree(grpc_url, speech):
    """35 s of samples at 22.05 kHz (two windows) equal the same audio sent as a wav file.
    (One temperature: these repeated sentences fail the compression-ratio check, and a sampled
    retry would differ between the two requests.)"""
    clip, rate = soundfile.read(speech(TWO_SENTENCES), dtype="float32")
    samples = np.concatenate([clip] * 6)
    assert len(samples) / rate > 30
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="FLOAT")
    one_temperature = {"language": "en", "sampling_parameters": sampling(temperature=0)}
    as_samples, as_file = grpc_many(
        grpc_url,
        MODEL,
        [
            ({"audio": samples, "sample_rate": rate, **one_temperature}, None),
            ({"audio_file": buffer.getvalue(), **one_temperature}, None),
        ],
    )
    assert as_samples.text == as_file.text and as_samples.text.count("lazy dog") == 6


SILENCE_S = 20.0
FIRST, SECOND = TWO_SENTENCES.split(". ")


def voiced_span(samples: np.ndarray) -> tuple[float, float]:
    """Where espeak-ng's voice is in its clip (it adds a little silence around it), seconds."""
    loud = np.flatnonzero(np.abs(samples) > 0.02)
    return loud[0] / 16000, (loud[-1] + 1) / 16000


def likeness(heard: str, said: str) -> float:
    """How alike two texts are, word by word (1.0: the same words in the same order)."""
    import difflib
    import re

    def words(text: str) -> list[str]:
        return re.findall(r"[a-z']+", text.lower())

    return difflib.SequenceMatcher(None, words(heard), words(said)).ratio()


def test_vad_filter_drops_silence_and_keeps_times_of_the_original_audio(grpc_url, speech):
    """Speech, 20 s of silence, speech: with vad_filter, Whisper hears the speech only, and the
    segments (base model and adapter alpha) still say where the words are in the audio sent."""
    first, second = load_16k(speech(FIRST + ".")), load_16k(speech(SECOND))
    samples = np.concatenate([first, np.zeros(int(SILENCE_S * 16000), np.float32), second])
    shift = len(first) / 16000 + SILENCE_S
    (a0, a1), (b0, b1) = voiced_span(first), voiced_span(second)
    voices = {FIRST: (a0, a1), SECOND: (b0 + shift, b1 + shift)}
    vad = sampling(vad_filter=True)
    fields = {"audio": samples, "language": "en", "sampling_parameters": vad}
    runs = [(None, True), ("alpha", True), (None, False)]
    # The second sentence (~2.1 s of voice) is shorter than min_speech_duration_ms: dropped.
    short_dropped = sampling(vad_filter=True, vad_parameters={"min_speech_duration_ms": 2500})
    bad = sampling(vad_filter=True, vad_parameters={"threshold": 2})
    *outcomes, first_only, refused = grpc_many(
        grpc_url,
        MODEL,
        [
            *[
                ({**fields, "timestamps": ts}, {"lora_name": name} if name else None)
                for name, ts in runs
            ],
            ({**fields, "sampling_parameters": short_dropped}, None),
            ({**fields, "sampling_parameters": bad}, None),
        ],
    )
    assert likeness(first_only.text, FIRST) > 0.8 and "listened" not in first_only.text
    assert "'vad_parameters' must be" in refused.error and '{"threshold": 2}' in refused.error
    for (name, with_timestamps), outcome in zip(runs, outcomes, strict=True):
        # Nothing invented in (or for) the silence: the words said, give or take a misheard one.
        text = outcome.text
        assert likeness(text, TWO_SENTENCES) > 0.8, (name, text)
        assert len(text.split()) <= len(TWO_SENTENCES.split()), (name, text)
        if not with_timestamps:
            continue
        segments = json.loads(outcome.outputs["segments"][0])
        by_sentence = {sentence: [] for sentence in voices}
        for segment in segments:  # the sentence it transcribes: its times must be that voice's
            sentence = max(voices, key=lambda said: likeness(segment["text"], said))
            by_sentence[sentence].append(segment)
        for sentence, (start, end) in voices.items():
            found = by_sentence[sentence]
            assert found, (name, sentence, segments)
            assert abs(found[0]["start"] - start) < 0.5, (name, sentence, start, segments)
            assert abs(found[-1]["end"] - end) < 0.5, (name, sentence, end, segments)
            for segment in found:
                assert start - 0.5 < segment["start"] <= segment["end"] < end + 0.5, segments


# ---- audio containers (PyAV) and bounded decoding ----------------------------------------------
def containers(wav) -> dict[str, bytes]:
    """The clip as a phone (m4a, AAC; or ALAC, lossless), a browser (webm, Opus) and a camera
    (mp4 with a video track) would send it, encoded here with PyAV."""
    from tests.audio_files import encode

    samples, rate = soundfile.read(wav, dtype="float32")
    return {
        "m4a": encode(samples, rate, "ipod", "aac")[0],
        "m4a alac": encode(samples, rate, "ipod", "alac")[0],
        "webm": encode(samples, rate, "webm", "libopus", codec_rate=48000)[0],
        "mp4": encode(samples, rate, "mp4", "aac", video="mpeg4")[0],
    }


def test_every_container_gives_the_text_of_its_audio(grpc_url, clip):
    """m4a, webm and mp4 files decode in the server to the text of the very samples PyAV
    decodes from them here (sent as raw `audio`), and lossless ALAC to the WAV's text; lossy
    AAC / Opus stay within a word of the WAV's (whisper-base on espeak-ng speech is on the edge
    between "round" and "brown": AAC or Opus at any bit rate can flip it, measured). The base
    model and an adapter, all requests at once (they share batches)."""
    from lora_serving.audio import decode_audio_file

    files = {"wav": clip.read_bytes(), **containers(clip)}
    runs = [
        (kind, form, name)
        for kind in files
        for form in (("file",) if kind == "wav" else ("file", "samples"))
        for name in (None, "alpha")
    ]

    def fields(kind: str, form: str) -> dict:
        if form == "file":
            return {"audio_file": files[kind]}
        samples, _ = decode_audio_file(files[kind], max_seconds=30)
        return {"audio": samples[None, :], "sample_rate": 16000}

    outcomes = grpc_many(
        grpc_url,
        MODEL,
        [
            (
                {**fields(kind, form), "language": "en", "sampling_parameters": sampling()},
                {"lora_name": name} if name else None,
            )
            for kind, form, name in runs
        ],
    )
    texts = {}
    for run, outcome in zip(runs, outcomes, strict=True):
        assert outcome.error is None, (run, outcome.error)
        texts[run] = outcome.text
    for kind, form, name in runs:
        if form == "samples":
            assert texts[kind, "file", name] == texts[kind, form, name], (kind, name, texts)
        assert likeness(texts[kind, "file", name], texts["wav", "file", name]) > 0.85, texts
    for name in (None, "alpha"):
        assert texts["m4a alac", "file", name] == texts["wav", "file", name]
    assert "fox jump" in texts["wav", "file", None]


def whisper_stub(server):
    import psutil

    stubs = [
        child
        for child in psutil.Process(server.process.pid).children()
        if "triton_python_backend_stub" in " ".join(child.cmdline())
        and "whisper_lora" in " ".join(child.cmdline())
    ]
    assert len(stubs) == 1, stubs
    return stubs[0]


def test_an_oversized_flac_is_refused_with_bounded_memory_while_others_are_served(
    grpc_url, triton_server, clip
):
    """1.2 MB of FLAC holding 2 h of 48 kHz stereo silence (2.7 GB decoded): refused from its
    header, and with a header that claims 10 s, refused once its decoding passes the 1800 s
    limit; the stub's RSS meanwhile grows by less than the limit's worth of 16 kHz float32
    (115 MB) resp. that plus small overhead; a request already in flight is served, and one
    sent while the lying file decodes (seconds) is answered before it: decoding runs in a planner
    thread, not in execute(), so it holds no other request back."""
    import threading
    import time

    from tests.audio_files import silence_flac, with_stated_samples

    limit_bytes = 1800 * 16000 * 4
    honest = silence_flac(7200)
    lying = with_stated_samples(honest, 48000 * 10)
    stub = whisper_stub(triton_server)
    fields = {"audio_file": clip.read_bytes(), "language": "en", "sampling_parameters": sampling()}
    expected = grpc_one(grpc_url, MODEL, fields)
    assert expected.error is None, expected.error

    def peak_growth(call) -> tuple[int, object]:
        start = peak = stub.memory_info().rss
        done = threading.Event()

        def sample():
            nonlocal peak
            while not done.wait(0.01):
                peak = max(peak, stub.memory_info().rss)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            result = call()
        finally:
            done.set()
            sampler.join()
        return max(peak, stub.memory_info().rss) - start, result

    served: dict = {}
    in_flight = threading.Thread(
        target=lambda: served.update(one=grpc_one(grpc_url, MODEL, fields))
    )
    in_flight.start()
    time.sleep(0.5)
    started = time.monotonic()
    honest_growth, refused = peak_growth(lambda: grpc_one(grpc_url, MODEL, {"audio_file": honest}))
    honest_s = time.monotonic() - started
    finished: list[str] = []
    # One second of digital silence: answered without the engine, so only a planner or an
    # execute() held by the other request's decoding could make it wait.
    short = {"audio": np.zeros((1, 16000), np.float32), "language": "en"}

    def sent_during_the_decode():
        time.sleep(0.3)
        served.update(short=grpc_one(grpc_url, MODEL, short))
        finished.append("short")

    behind = threading.Thread(target=sent_during_the_decode)
    behind.start()
    lying_growth, refused_lying = peak_growth(
        lambda: grpc_one(grpc_url, MODEL, {"audio_file": lying})
    )
    finished.append("lying")
    behind.join()
    in_flight.join()
    print(
        f"\n2 h FLAC refused in {honest_s:.2f} s, stub RSS +{honest_growth / 1e6:.1f} MB; "
        f"with a lying header +{lying_growth / 1e6:.1f} MB (limit's worth {limit_bytes / 1e6:.1f})"
    )
    assert refused.error and "longer than the 1800 s limit (its header states 7200.0 s)" in (
        refused.error
    )
    assert refused_lying.error and (
        "decodes to more than the 1800 s limit (its header states 10.0 s)" in refused_lying.error
    )
    assert honest_growth < limit_bytes and honest_s < 5
    assert lying_growth < limit_bytes + 32_000_000
    assert served["one"].error is None and served["one"].text == expected.text
    assert served["short"].error is None, served["short"].error
    assert finished == ["short", "lying"], "a request waited for another's decoding"


# ---- hotwords and prefix ---------------------------------------------------------------------
HOTWORDS = "Fawkes, lazy dogs"
PREFIX_TEXT = "The quick brown"


def test_hotwords_and_prefix_decode_as_the_merged_reference(grpc_url, clip, demo_models, tokenizer):
    """faster-whisper's prompts: hotwords as previous text, the prefix after the task tokens;
    served text == transformers' greedy decoding after the same prompt on the merged weights,
    for the base and an adapter sharing batches."""
    task = tokenizer.convert_tokens_to_ids(
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
    )
    words = lambda text: tokenizer.encode(" " + text, add_special_tokens=False)  # noqa: E731
    prompts = {
        "hotwords": [tokenizer.convert_tokens_to_ids("<|startofprev|>"), *words(HOTWORDS), *task],
        "prefix": [*task, *words(PREFIX_TEXT)],
    }
    options = {"hotwords": {"hotwords": HOTWORDS}, "prefix": {"prefix": PREFIX_TEXT}}
    runs = [(kind, name) for kind in prompts for name in (None, "alpha")]
    outcomes = grpc_many(
        grpc_url,
        MODEL,
        [
            (
                {
                    "audio_file": clip.read_bytes(),
                    "language": "en",
                    "sampling_parameters": sampling(max_tokens=40, **options[kind]),
                },
                {"lora_name": name} if name else None,
            )
            for kind, name in runs
        ],
    )
    for (kind, name), outcome in zip(runs, outcomes, strict=True):
        assert outcome.error is None, (kind, name, outcome.error)
        tokens = reference_tokens(demo_models, name, clip, prompts[kind], max_tokens=40)
        expected = tokenizer.decode(tokens, skip_special_tokens=True).strip()
        assert outcome.text == expected, (kind, name)
        plain = reference_tokens(demo_models, name, clip, task, max_tokens=40)
        assert tokens != plain, (kind, name)  # the prompt changes what is decoded
    assert not outcomes[2].text.startswith("The quick")  # the transcript continues the prefix
