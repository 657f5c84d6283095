"""The served window padding equals the merged-weights reference's, two implementations apart.

The engine pads a short window as vllm_plugin.whisper_feature_padding does (transformers'
30 s window, then the frames after the audio set to zero); the reference
(tests/reference/whisper.py) builds it as openai-whisper's `transcribe()` does (the log-mel of
the audio followed by 30 s of silence, its content frames, then zero frames). Served tokens are
compared with the reference's, so the two windows must be the same, bit for bit: they are, for
every recording shorter than 30 s (every reference input in the suite). A full 30 s window
differs in its last frame only (test below)."""

import numpy as np
import pytest
import torch

from lora_serving.vllm_plugin.whisper_feature_padding import padded_features
from tests.reference.whisper import reference_features

RATE = 16_000


def recordings() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    seconds = lambda s: np.arange(int(s * RATE)) / RATE  # noqa: E731
    tone = lambda s, hz: np.sin(2 * np.pi * hz * seconds(s))  # noqa: E731
    return {
        "noise_1s": 0.1 * rng.standard_normal(RATE),
        "tone_and_noise_2.5s": 0.5 * tone(2.5, 440) + 0.05 * rng.standard_normal(int(2.5 * RATE)),
        "not_a_whole_frame": 0.2 * rng.standard_normal(RATE + 37),  # 16_037 samples
        "shorter_than_a_frame_hop": 0.3 * rng.standard_normal(100),
        "quiet": 1e-4 * rng.standard_normal(3 * RATE),  # the floor (max - 8) decides
        "clipped_loud": np.clip(3.0 * tone(4, 200), -1, 1),
        "silence": np.zeros(2 * RATE),
        "chirp_12.3s": np.sin(2 * np.pi * (100 + 300 * seconds(12.3)) * seconds(12.3)),
        "almost_30s": 0.1 * rng.standard_normal(30 * RATE - 1),
    }


@pytest.fixture(scope="module")
def extractor(demo_models):
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor.from_pretrained(demo_models / "whisper-base")


@pytest.mark.parametrize("name", sorted(recordings()))
def test_served_padding_equals_the_reference_window(name, extractor, demo_models):
    samples = recordings()[name].astype(np.float32)
    served = padded_features(extractor, samples)
    reference = reference_features(demo_models / "whisper-base", samples)
    assert served.shape == reference.shape == (1, 80, 3000)
    assert served.dtype == reference.dtype == torch.float32
    assert torch.equal(served, reference), (served - reference).abs().max()
    audio_frames = len(samples) // extractor.hop_length
    assert served[..., audio_frames:].eq(0).all()  # the padding, in both: zero frames
    if name != "silence" and audio_frames:
        assert not served[..., :audio_frames].eq(0).all()  # and the audio's own frames


def test_a_full_window_differs_in_its_last_frame_only(extractor, demo_models):
    """The last frame's STFT window reaches past the audio: the served window (transformers'
    feature extractor on exactly 30 s) reflects the audio back there, openai-whisper hears the
    silence that follows the recording. Every other frame is the same."""
    samples = (0.1 * np.random.default_rng(3).standard_normal(30 * RATE)).astype(np.float32)
    served = padded_features(extractor, samples)
    reference = reference_features(demo_models / "whisper-base", samples)
    assert torch.equal(served[..., :-1], reference[..., :-1])
    # If this fails, the served padding became openai-whisper's for a full window too: move
    # this recording into the table above.
    assert not torch.equal(served[..., -1], reference[..., -1])
