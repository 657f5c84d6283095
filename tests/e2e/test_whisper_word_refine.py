"""Word timestamps through Triton: the alignment capture in mixed batches with adapters, and
`word_timestamps_refine` on speech with known gaps.

Six espeak-ng words are joined by measured silences (0.6-1.4 s), so each word's true start and
end are known (its samples above a small amplitude). openai-whisper's timings
(`word_timestamps_refine=false`) let a word after a pause absorb the silence before it; the
refined ones (default) must put every start within 0.1 s and every end within 0.2 s of the
truth. One batch carries the refined request, the same request unrefined, and unrefined ones
with a decoder-only and a cross-attention adapter plus a plain timestamps request, so the
alignment requests share engine steps with other requests and adapters; the unrefined base
request must give the same words as when it is sent alone (the capture reads only its rows).
"""

import json

import numpy as np
import pytest

from tests.conftest import load_16k, only_with_model
from tests.e2e.triton_calls import grpc_many, grpc_one, sampling

pytestmark = [pytest.mark.e2e, only_with_model("whisper_lora")]
MODEL = "whisper_lora"
WORDS = ["apple", "river", "window", "garden", "yellow", "market"]
GAPS_S = [0.6, 1.0, 1.4, 0.8, 1.2]
RATE = 16_000
START_TOLERANCE_S, END_TOLERANCE_S = 0.1, 0.2


def _trimmed(samples: np.ndarray) -> np.ndarray:
    loud = np.flatnonzero(np.abs(samples) > 0.02 * np.abs(samples).max())
    return samples[loud[0] : loud[-1] + 1]


@pytest.fixture(scope="module")
def recording(speech, tmp_path_factory):
    """(wav bytes, [(true start, true end)]) of the words joined by GAPS_S."""
    import soundfile

    pieces, truth, at = [np.zeros(int(0.5 * RATE), np.float32)], [], 0.5
    for index, word in enumerate(WORDS):
        samples = _trimmed(load_16k(speech(word)))
        truth.append((at, at + len(samples) / RATE))
        pieces.append(samples)
        at += len(samples) / RATE
        gap = GAPS_S[index] if index < len(GAPS_S) else 0.5
        pieces.append(np.zeros(int(gap * RATE), np.float32))
        at += int(gap * RATE) / RATE
    path = tmp_path_factory.mktemp("words") / "gaps.wav"
    soundfile.write(path, np.concatenate(pieces), RATE)
    return path.read_bytes(), truth


def _words(outcome) -> list[dict]:
    assert outcome.error is None, outcome.error
    segments = json.loads(outcome.outputs["segments"][0])
    return [word for segment in segments for word in segment["words"]]


def test_refined_words_and_mixed_batch_capture(grpc_url, recording):
    audio, truth = recording

    def words_request(refine: bool, adapter: str | None = None):
        params = sampling(word_timestamps=True, word_timestamps_refine=refine)
        fields = {"audio_file": audio, "language": "en", "sampling_parameters": params}
        return fields, ({"lora_name": adapter} if adapter else None)

    plain = ({"audio_file": audio, "language": "en", "timestamps": True}, {"lora_name": "beta"})
    batch = [
        words_request(True),
        words_request(False),
        words_request(False, "alpha"),
        words_request(False, "cross_kv"),
        plain,
    ]
    refined, unrefined, alpha, cross_kv, timestamps_only = grpc_many(grpc_url, MODEL, batch)
    alone = grpc_one(grpc_url, MODEL, *words_request(False))

    assert _words(unrefined) == _words(alone)  # other requests in the steps change nothing
    for outcome in (alpha, cross_kv):
        assert [w["word"] for w in _words(outcome)], "adapter requests get words too"
    segments = json.loads(timestamps_only.outputs["segments"][0])
    assert segments and all("words" not in segment for segment in segments)

    got = _words(refined)
    assert [w["word"].strip(" .,!?").lower() for w in got] == WORDS
    starts = [abs(w["start"] - t[0]) for w, t in zip(got, truth, strict=True)]
    ends = [abs(w["end"] - t[1]) for w, t in zip(got, truth, strict=True)]
    before = [abs(w["start"] - t[0]) for w, t in zip(_words(unrefined), truth, strict=True)]
    print(
        f"\nword start |Δ| refined max {max(starts):.3f} mean {np.mean(starts):.3f} s; "
        f"unrefined max {max(before):.3f} mean {np.mean(before):.3f} s; "
        f"end |Δ| refined max {max(ends):.3f} s"
    )
    assert max(starts) <= START_TOLERANCE_S, list(zip(got, truth, strict=True))
    assert max(ends) <= END_TOLERANCE_S, list(zip(got, truth, strict=True))
    for word in got:
        assert set(word) == {"word", "start", "end", "probability"}
        assert 0 <= word["probability"] <= 1 and word["start"] <= word["end"]
