"""Word-level timestamps through tritonserver, judged by openai-whisper itself.

With `word_timestamps_refine=false` every word equals openai-whisper's
`transcribe(word_timestamps=True)` (PyPI, its own environment: scripts/openai_whisper.sh) run on
the PEFT-merged float32 weights converted to its checkpoint layout (tests/openai_whisper/): the
same words, each start and end within 0.02 s (one encoder frame), for the base model, a decoder
adapter (alpha), a cross-attention adapter (cross_kv) and an all-layer adapter, sent at once so
they share batches; on a clip where an adapter moves the timings; and across two 30 s windows.
With the default (refined), on espeak-ng words joined by measured silences
(lora_tools.bench.word_gaps), every word starts within 0.1 s and ends within 0.2 s of the truth.
"""

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from lora_serving.audio import decode_audio_file, to_whisper_input
from lora_tools.bench.word_gaps import bare, gap_clip
from tests.conftest import only_with_model
from tests.e2e.triton_calls import grpc_many, sampling
from tests.openai_whisper import install_reference_env, reference_transcribe
from tests.openai_whisper.convert import convert

pytestmark = only_with_model("whisper_lora")

FOX = "The quick brown fox jumps over the lazy dog. Then it ran away."
LONG = [  # about 40 s of speech with pauses: two 30 s windows
    "A quiet sailor fixed the broken chair on the hill.",
    "The young teacher carried a heavy box near the river.",
    "An old farmer painted the wooden fence in the garden.",
    "The tall doctor found a silver key at the market.",
    "A happy painter opened the front door behind the school.",
    "The tired baker cleaned the kitchen floor on the hill.",
    "A busy driver bought fresh vegetables near the river.",
    "The quiet student watched the evening news in the garden.",
]
KINDS = [None, "alpha", "cross_kv", "all_layers"]  # base, decoder, cross-attention, all layers
FRAME_S = 0.02  # one encoder frame
START_TOLERANCE_S, END_TOLERANCE_S = 0.1, 0.2


def _samples(data: bytes) -> np.ndarray:
    """The samples the server decodes from `data` (the reference hears exactly these)."""
    samples, rate = decode_audio_file(data, max_seconds=1800)
    return to_whisper_input(samples, rate, max_seconds=1800)


def _wav(samples: np.ndarray) -> bytes:
    import io

    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, samples, 16_000, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def clips(speech):
    fox = speech(FOX).read_bytes()
    pause = np.zeros(16_000 * 6 // 10, np.float32)
    long_samples = np.concatenate(
        [piece for s in LONG for piece in (_samples(speech(s).read_bytes()), pause)]
    )
    gaps = gap_clip()
    return {"fox": fox, "long": _wav(long_samples), "gaps": gaps.wav(), "truth": gaps.words}


def _request(audio: bytes, refine: bool) -> dict:
    options = {"word_timestamps": True} | ({} if refine else {"word_timestamps_refine": False})
    return {
        "audio_file": audio,
        "language": "en",
        "timestamps": True,
        "sampling_parameters": sampling(**options),
    }


# (clip, adapter, refine): one batch of concurrent requests for the whole module.
CASES = [("fox", kind, False) for kind in KINDS] + [
    ("long", None, False),
    ("gaps", None, False),
    ("gaps", None, True),
]


@pytest.fixture(scope="module")
def served(grpc_url, clips, pending_references):
    """The served answers; openai-whisper's run meanwhile (pending_references)."""
    outcomes = grpc_many(
        grpc_url,
        "whisper_lora",
        [
            (_request(clips[clip], refine), {"lora_name": kind} if kind else None)
            for clip, kind, refine in CASES
        ],
    )
    answers = {}
    for case, outcome in zip(CASES, outcomes, strict=True):
        assert outcome.error is None, (case, outcome.error)
        answers[case] = json.loads(outcome.outputs["segments"][0])
    return answers


@pytest.fixture(scope="module")
def pending_references(request, demo_models, clips, tmp_path_factory):
    """openai-whisper's transcribe() of each exact case on that adapter's merged weights, in a
    thread of its own (a process of its own, mostly) while the server answers."""
    install_reference_env(request)
    folder = tmp_path_factory.mktemp("openai_whisper_checkpoints")
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(_references, demo_models, clips, folder)


@pytest.fixture(scope="module")
def references(pending_references, served):
    return pending_references.result(timeout=900)


def _references(demo_models, clips, folder) -> dict:
    base = demo_models / "whisper-base"
    checkpoints = {
        kind: convert(
            base, demo_models / "whisper-adapters" / kind if kind else None, folder / f"{kind}.pt"
        )
        for kind in KINDS
    }
    exact = [(clip, kind) for clip, kind, refine in CASES if not refine]
    options = {"language": "en", "task": "transcribe"}
    results = reference_transcribe(
        [(checkpoints[kind], _samples(clips[clip]), options) for clip, kind in exact]
    )
    return {case: result["segments"] for case, result in zip(exact, results, strict=True)}


def _words(segments: list[dict]) -> list[dict]:
    return [word for segment in segments for word in segment["words"]]


def _largest_difference(ours: list[dict], theirs: list[dict]) -> float:
    return max(
        max(abs(a["start"] - b["start"]), abs(a["end"] - b["end"]))
        for a, b in zip(ours, theirs, strict=True)
    )


@pytest.mark.parametrize(
    ("clip", "kind"),
    [("fox", kind) for kind in KINDS] + [("long", None), ("gaps", None)],
    ids=[f"fox-{kind or 'base'}" for kind in KINDS] + ["long-base", "gaps-base"],
)
def test_exact_word_timings_equal_openai_whisper(served, references, clip, kind):
    ours, theirs = _words(served[(clip, kind, False)]), _words(references[(clip, kind)])
    assert [w["word"] for w in ours] == [w["word"] for w in theirs]
    largest = _largest_difference(ours, theirs)
    print(f"{clip} {kind or 'base'}: {len(ours)} words, max |Δ| {largest:.3f} s")
    apart = [
        (a["word"], (a["start"], a["end"]), "openai-whisper:", (b["start"], b["end"]))
        for a, b in zip(ours, theirs, strict=True)
        if max(abs(a["start"] - b["start"]), abs(a["end"] - b["end"])) > FRAME_S + 1e-6
    ]
    assert not apart, f"{len(apart)} words apart, the first: {apart[:6]}"
    if clip == "long":
        assert served[(clip, kind, False)][-1]["end"] > 30.0  # the words of a second window


def test_an_adapter_moves_the_timings_and_ours_follow(served, references):
    """cross_kv hears the fox clip otherwise: openai-whisper's own timings of base and cross_kv
    differ, and each served answer is its own reference's (checked word by word above)."""
    base, adapter = _words(references[("fox", None)]), _words(references[("fox", "cross_kv")])
    moved = [
        (a["word"], a["start"], b["start"])
        for a, b in zip(base, adapter, strict=False)
        if abs(a["start"] - b["start"]) > 2 * FRAME_S or abs(a["end"] - b["end"]) > 2 * FRAME_S
    ]
    assert moved, "the adapter should move some word"
    ours_base = _words(served[("fox", None, False)])
    ours_adapter = _words(served[("fox", "cross_kv", False)])
    assert [(w["start"], w["end"]) for w in ours_base] != [
        (w["start"], w["end"]) for w in ours_adapter
    ]


def test_refined_words_fall_on_the_speech(served, clips):
    truth = clips["truth"]
    words = _words(served[("gaps", None, True)])
    assert [bare(w["word"]) for w in words] == [t.word for t in truth]
    starts = [w["start"] - t.start for w, t in zip(words, truth, strict=True)]
    ends = [w["end"] - t.end for w, t in zip(words, truth, strict=True)]
    exact = [
        w["start"] - t.start
        for w, t in zip(_words(served[("gaps", None, False)]), truth, strict=True)
    ]
    print(f"gaps refined: start Δ {np.round(starts, 3)}, end Δ {np.round(ends, 3)}")
    print(f"gaps base exact (openai-whisper's timings): start Δ {np.round(exact, 3)}")
    assert max(map(abs, starts)) <= START_TOLERANCE_S
    assert max(map(abs, ends)) <= END_TOLERANCE_S
