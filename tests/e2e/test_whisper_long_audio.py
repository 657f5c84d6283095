"""A 3-minute recording: cut into 30 s windows, decoded together, stitched in order.

The recording is espeak-ng sentences with a known pause between them, so the test knows where
every sentence starts and can check the segment times the server computes across windows.
"""

import difflib
import io
import itertools
import json

import numpy as np
import pytest
import soundfile

from tests.e2e.triton_calls import grpc_many

MINUTES = 3  # six windows: every stitch a longer recording has, at 3/5 of the cost
PAUSE_S = 0.6
PEOPLE = ["teacher", "farmer", "doctor", "painter", "sailor", "baker", "driver", "student"]
ADJECTIVES = ["young", "old", "tall", "quiet", "happy", "tired", "busy"]
ACTIONS = [
    "carried a heavy box",
    "painted the wooden fence",
    "found a silver key",
    "opened the front door",
    "cleaned the kitchen floor",
    "bought fresh vegetables",
    "watched the evening news",
    "planted a small tree",
    "fixed the broken chair",
]
PLACES = ["near the river", "in the garden", "at the market", "behind the school", "on the hill"]


def sentences():
    """Distinct simple sentences, as many as needed."""
    for i in itertools.count():
        adjective, person = ADJECTIVES[i % 7], PEOPLE[i % 8]
        yield f"The {adjective} {person} {ACTIONS[i % 9]} {PLACES[i % 5]}."


def words(text: str) -> list[str]:
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    return EnglishTextNormalizer({})(text).split()


@pytest.fixture(scope="module")
def recording(speech):
    """(flac bytes, [(sentence, start second)], duration): at least MINUTES minutes of speech."""
    pieces, said, position, rate = [], [], 0, None
    for sentence in sentences():
        clip, rate = soundfile.read(speech(sentence, voice="en"), dtype="float32")
        said.append((sentence, position / rate))
        pieces += [clip, np.zeros(int(PAUSE_S * rate), np.float32)]
        position += len(clip) + int(PAUSE_S * rate)
        if position >= MINUTES * 60 * rate:
            break
    buffer = io.BytesIO()
    soundfile.write(buffer, np.concatenate(pieces), rate, format="FLAC")
    return buffer.getvalue(), said, position / rate


@pytest.fixture(scope="module")
def outcomes(grpc_url, recording):
    """The recording streamed with timestamps, and at the same time plain (both share batches)."""
    flac = recording[0]
    streamed = {"audio_file": flac, "language": "en", "timestamps": True, "stream": True}
    plain = {"audio_file": flac}  # language detected from the first window
    both = grpc_many(grpc_url, "whisper_lora", [(streamed, None), (plain, None)])
    return {"streamed": both[0], "plain": both[1]}


@pytest.mark.parametrize("kind", ["streamed", "plain"])
def test_every_sentence_comes_back_in_order(recording, outcomes, kind):
    _, said, duration = recording
    text = outcomes[kind].text
    heard = words(text)
    expected = [words(sentence) for sentence, _ in said]
    flat = [word for sentence in expected for word in sentence]
    # Monotonic alignment: a sentence counts as heard, in its place, when most of its words are.
    matcher = difflib.SequenceMatcher(None, flat, heard, autojunk=False)
    matched = np.zeros(len(flat), bool)
    for block in matcher.get_matching_blocks():
        matched[block.a : block.a + block.size] = True
    bounds = np.cumsum([0] + [len(sentence) for sentence in expected])
    share = [matched[a:b].mean() for a, b in itertools.pairwise(bounds)]
    unmatched = 1 - matched.mean()
    print(f"\n{kind}: {duration:.0f} s, {len(said)} sentences, {unmatched:.1%} words unmatched")
    missing = [said[i][0] for i, value in enumerate(share) if value < 0.5]
    assert not missing, (missing, text)
    assert outcomes[kind].outputs["language"] == ["en"]


def test_streamed_text_adds_up_and_segments_carry_recording_times(recording, outcomes):
    _, said, duration = recording
    outcome = outcomes["streamed"]
    # The default schedule may retry a window, so its text comes window by window, each as soon
    # as the window is accepted (one temperature would stream segment by segment).
    assert len(outcome.partials) >= int(duration // 30)
    assert "".join(outcome.partials) == outcome.text
    segments = json.loads(outcome.outputs["segments"][0])
    starts = [segment["start"] for segment in segments]
    assert starts == sorted(starts) and all(s["end"] >= s["start"] for s in segments)
    assert segments[-1]["end"] <= duration + 0.01 and segments[-1]["end"] > duration - 10
    assert " ".join(segment["text"] for segment in segments) == outcome.text
    # Whisper's segments are sentences here: most start where a sentence starts.
    true_starts = np.array([start for _, start in said])
    distance = [np.abs(true_starts - start).min() for start in starts]
    near = np.mean(np.array(distance) < 1.0)
    print(f"\n{len(segments)} segments, {near:.0%} start within 1 s of a sentence start")
    assert near >= 0.8
    # Each window, decoded with the text before it as previous text, kept its first attempt.
    assert {segment["temperature"] for segment in segments} == {0.0}
