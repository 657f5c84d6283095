"""whisper_lora decodes like openai-whisper's `transcribe()`, end to end (issue 14):
beam search equal to transformers' `generate(num_beams=5)` for base and adapters sharing batches,
with the encoder run once per request (counted on /metrics); beam_rule "faster-whisper" equal to
faster-whisper itself (its own environment, the same CTranslate2 whisper-base), with and without
timestamps; silence, noise and a pure tone give no text; a window greedy decoding loops on is
retried at higher temperatures, visibly.
"""

import json
import re
import time
import urllib.request

import numpy as np
import pytest

from tests.conftest import load_16k, only_with_model
from tests.e2e.triton_calls import grpc_many, grpc_one, sampling

MODEL = "whisper_lora"
pytestmark = only_with_model(MODEL)
SENTENCE = "The quick brown fox jumps over the lazy dog."
PROMPT_TOKENS = ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]


@pytest.fixture(scope="module")
def tokenizer(demo_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_models / "whisper-base")


ENCODER_COUNTERS = (
    "lora_encoder_runs_total",
    "lora_encoder_reuses_total",
    "lora_cross_kv_runs_total",
    "lora_cross_kv_reuses_total",
)


def encoder_totals(metrics_port: int) -> tuple[int, ...]:
    """(windows encoded, encoder outputs reused, cross-attention K/V computed, reused) on
    Triton's /metrics, over every stub."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    totals = []
    for name in ENCODER_COUNTERS:
        pattern = rf'^{name}\{{model="{MODEL}"[^}}]*\}} (\S+)$'
        totals.append(int(sum(float(v) for v in re.findall(pattern, text, re.MULTILINE))))
    return tuple(totals)


def settled_encoder_totals(metrics_port: int) -> tuple[int, ...]:
    """The totals once they stop moving (they are read from the engine after each job)."""
    last, deadline = encoder_totals(metrics_port), time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = encoder_totals(metrics_port)
        if now == last:
            return now
        last = now
    return last


def test_beam_search_equals_transformers_and_encodes_each_request_once(
    grpc_url, triton_server, speech, demo_models, tokenizer
):
    """Beam 5 for base, a decoder adapter and an all-layer adapter, plus a greedy request, all
    at once (they share batches): each equals transformers on the merged weights."""
    from tests.reference.whisper import reference_generate

    clip = speech(SENTENCE)
    runs = [(None, 5), ("alpha", 5), ("all_layers", 5), (None, 1)]
    before = settled_encoder_totals(triton_server.metrics)
    outcomes = grpc_many(
        grpc_url,
        MODEL,
        [
            (
                {
                    "audio_file": clip.read_bytes(),
                    "language": "en",
                    "sampling_parameters": sampling(
                        beam_size=beams, beam_rule="transformers", max_tokens=40
                    ),
                },
                {"lora_name": name} if name else None,
            )
            for name, beams in runs
        ],
    )
    after = settled_encoder_totals(triton_server.metrics)
    encoded, reused, cross_computed, cross_reused = (
        a - b for a, b in zip(after, before, strict=True)
    )
    prompt = tokenizer.convert_tokens_to_ids(PROMPT_TOKENS)
    base = demo_models / "whisper-base"
    texts = {}
    for (name, beams), outcome in zip(runs, outcomes, strict=True):
        adapter = demo_models / "whisper-adapters" / name if name else None
        tokens, _ = reference_generate(base, adapter, load_16k(clip), prompt, 40, num_beams=beams)
        expected = tokenizer.decode(tokens, skip_special_tokens=True).strip()
        assert outcome.text.strip() == expected, (name, beams)
        texts[(name, beams)] = outcome.text
    assert texts[(None, 5)] != texts[(None, 1)]  # beams find another transcript here
    # One window per request: each encoded once; the no-speech probe and every beam step of
    # the window reused that output.
    assert encoded == len(runs)
    assert reused >= len(runs) + 3 * 5 * 5
    # Cross-attention K/V (counted per request window and decoder layer): computed in a
    # window's first steps, reused by its beam steps (the all_layers adapter has kv_proj LoRA).
    layers = json.loads((demo_models / "whisper-base" / "config.json").read_text())
    assert cross_reused >= layers["decoder_layers"] * 3 * 5 * 4
    assert cross_computed <= cross_reused / 5, (cross_computed, cross_reused)


def test_transformers_beams_with_timestamps_are_refused_clearly(grpc_url, speech):
    fields = {
        "audio_file": speech(SENTENCE).read_bytes(),
        "timestamps": True,
        "sampling_parameters": sampling(beam_size=3, beam_rule="transformers"),
    }
    outcome = grpc_one(grpc_url, MODEL, fields)
    assert outcome.error is not None and "beam_rule 'faster-whisper'" in outcome.error


def test_default_beam_rule_equals_faster_whisper(
    grpc_url, speech, tmp_path, demo_models, tokenizer
):
    """Beam 5 by the default rule (CTranslate2's) equals faster-whisper's beam 5 on the same
    whisper-base: a sentence where the two rules disagree (the word error rate bench's), plain,
    and a longer recording with timestamps, segment by segment; with an adapter, it equals the
    same search on the merged weights."""
    from lora_serving.launcher import REPO_ROOT
    from lora_tools.bench import peer_env, wer
    from lora_tools.finetune import corpus
    from tests.reference.whisper import reference_ctranslate2_beam

    (where_rules_differ,) = [u for u in wer.utterances() if "slowly" in u.text]
    plain = tmp_path / "slowly-16k.wav"
    wer.write_wav_16k(corpus.load_16k(corpus.synthesise(where_rules_differ, tmp_path)), plain)
    timed = speech(
        "The library closes at eight on weekdays. Our flight was delayed by three hours. "
        "Do you know where I left my car keys?"
    )
    arguments = wer.WerSetting("beam5", "", 5).faster_whisper()
    peer = wer.transcribe_faster_whisper(
        peer_env.ensure("faster-whisper", REPO_ROOT / wer.PEER_LOCK, print),
        wer.write_ct2_folder(tmp_path / "ct2-whisper-base"),
        [plain, timed],
        1,
        tmp_path / "job.json",
        tmp_path / "faster-whisper.log",
        settings={
            "plain": arguments,
            "timestamps": arguments | {"without_timestamps": False},
        },
    )

    def request(audio: bytes, adapter: str | None = None, **options) -> tuple[dict, dict | None]:
        fields = {"audio_file": audio, "language": "en", "timestamps": options.pop("ts", False)}
        fields["sampling_parameters"] = sampling(beam_size=5, max_tokens=100, **options)
        return fields, ({"lora_name": adapter} if adapter else None)

    # Beam 5 by the default rule (faster-whisper's), plain and with timestamps, beside the same
    # sentence by transformers' rule and an all-layer adapter by the default rule: one batch.
    ours_plain, ours_timed, transformers_rule, adapter_plain = grpc_many(
        grpc_url,
        MODEL,
        [
            request(plain.read_bytes()),
            request(timed.read_bytes(), ts=True),
            request(plain.read_bytes(), beam_rule="transformers"),
            request(plain.read_bytes(), "all_layers"),
        ],
    )
    assert ours_plain.text.strip() == peer["plain"]["texts"][0]
    assert transformers_rule.text.strip() != ours_plain.text.strip()  # the rules differ here
    theirs = peer["timestamps"]["segments"][1]
    served = json.loads(ours_timed.outputs["segments"][0])
    assert len(theirs) >= 2
    assert [s["text"].strip() for s in served] == [s["text"].strip() for s in theirs]
    for mine, peers in zip(served, theirs, strict=True):
        assert mine["start"] == pytest.approx(peers["start"], abs=0.011)
        assert mine["end"] == pytest.approx(peers["end"], abs=0.011)
    # faster-whisper cannot load an adapter: the same search on the merged weights instead.
    tokens = reference_ctranslate2_beam(
        demo_models / "whisper-base",
        demo_models / "whisper-adapters" / "all_layers",
        load_16k(plain),
        tokenizer.convert_tokens_to_ids(PROMPT_TOKENS),
        100,
    )
    expected = tokenizer.decode(tokens, skip_special_tokens=True).strip()
    assert adapter_plain.text.strip() == expected


@pytest.mark.parametrize("timestamps", [False, True])
def test_silence_noise_and_a_tone_give_no_text(grpc_url, timestamps):
    """No text and no segment, plain and with timestamps, with and without an adapter."""
    seconds = 10 * 16000
    rng = np.random.default_rng(0)
    signals = {
        "silence": np.zeros(seconds, np.float32),
        "noise": (0.1 * rng.standard_normal(seconds)).astype(np.float32),
        "tone": (0.1 * np.sin(2 * np.pi * 440 * np.arange(seconds) / 16000)).astype(np.float32),
    }
    requests = [
        (
            {"audio": samples, "language": "en", "timestamps": timestamps},
            {"lora_name": adapter} if adapter else None,
        )
        for samples in signals.values()
        for adapter in (None, "all_layers")
    ]
    labels = [(kind, adapter) for kind in signals for adapter in (None, "all_layers")]
    for label, outcome in zip(labels, grpc_many(grpc_url, MODEL, requests), strict=True):
        assert outcome.text == "", label
        assert json.loads(outcome.outputs["segments"][0]) == [], label


def test_a_looping_window_is_retried_at_higher_temperatures(grpc_url, speech):
    """Greedy decoding of this recording repeats itself (gzip ratio above 2.4): the window is
    decoded again at 0.2, 0.4, ... and the segment says which attempt was kept; with a seed the
    sampled retries are reproducible."""
    looping = speech("I am here. " * 10).read_bytes()

    def segments(**options):
        fields = {
            "audio_file": looping,
            "language": "en",
            "timestamps": True,
            "sampling_parameters": sampling(**options),
        }
        outcome = grpc_one(grpc_url, MODEL, fields)
        return outcome.text, json.loads(outcome.outputs["segments"][0])

    _, greedy = segments(temperature=0)
    assert greedy and all(s["temperature"] == 0.0 for s in greedy)
    assert greedy[0]["compression_ratio"] > 2.4  # what the default schedule retries
    text, retried = segments(seed=7)
    assert retried and retried[0]["temperature"] > 0.0
    for segment in retried:
        assert set(segment) >= {"avg_logprob", "compression_ratio", "no_speech_prob"}
        assert 0.0 <= segment["no_speech_prob"] <= 1.0
    assert segments(seed=7) == (text, retried)


def test_vllm_backend_additional_outputs(grpc_url, speech):
    """vllm_backend's return_* inputs work on whisper_lora too (over all of a row's windows)."""
    asked = ("finish_reason", "cumulative_logprob", "num_input_tokens", "num_output_tokens")
    fields = {"audio_file": speech(SENTENCE).read_bytes(), "language": "en"}
    outcome = grpc_one(grpc_url, MODEL, {**fields, **{f"return_{name}": True for name in asked}})
    outputs = outcome.outputs
    assert outputs["finish_reason"] == ["stop"] and outputs["num_input_tokens"][0] >= 4
    assert outputs["num_output_tokens"][0] > 5 and -50 < outputs["cumulative_logprob"][0] < 0
    assert (
        "logprobs" not in outputs
        and "finish_reason" not in grpc_one(grpc_url, MODEL, fields).outputs
    )
