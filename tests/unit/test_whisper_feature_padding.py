"""A short window's log-mel frames: the audio's own, then zeros (openai-whisper's padding)."""

import numpy as np
import torch

from lora_serving.vllm_plugin.whisper_feature_padding import padded_features, zero_after_audio


def test_frames_after_each_audio_are_zero_and_the_audio_frames_stay():
    features = torch.ones(2, 80, 3000)
    zero_after_audio(features, [16_000, 480_000])
    assert features[0, :, :100].eq(1).all() and features[0, :, 100:].eq(0).all()
    assert features[1].eq(1).all()  # a full 30 s window is left as it is


def test_padded_features_keep_transformers_frames_of_the_audio(demo_models):
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor.from_pretrained(demo_models / "whisper-base")
    rng = np.random.default_rng(0)
    samples = (0.1 * rng.standard_normal(2 * 16_000)).astype(np.float32)
    plain = extractor(samples, sampling_rate=16_000, return_tensors="pt").input_features
    padded = padded_features(extractor, samples)
    assert padded.shape == plain.shape == (1, 80, 3000)
    assert torch.equal(padded[..., :200], plain[..., :200])
    assert padded[..., 200:].eq(0).all() and not plain[..., 200:].eq(0).all()
