"""Long recordings -> 30 s windows cut in quiet moments, with their offsets."""

import numpy as np

from lora_serving.audio import WHISPER_SAMPLE_RATE, split_windows

RATE = WHISPER_SAMPLE_RATE


def speech_with_pauses(seconds: float, pause_every_s: float) -> np.ndarray:
    """A tone that stops for 0.3 s every `pause_every_s` seconds."""
    t = np.arange(int(seconds * RATE)) / RATE
    samples = (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)
    samples[(t % pause_every_s) > pause_every_s - 0.3] = 0.0
    return samples


def test_up_to_30_s_is_one_window():
    samples = np.ones(30 * RATE, np.float32)
    (window,) = split_windows(samples)
    assert window.offset_s == 0.0 and window.samples is samples and window.duration_s == 30.0


def test_five_minutes_are_cut_in_the_pauses_and_offsets_add_up():
    samples = speech_with_pauses(300, pause_every_s=1.0)  # a pause in every window's last second
    windows = split_windows(samples)
    assert len(windows) == 11  # ten cuts, each a little before 30 s
    assert all(window.duration_s <= 30.0 for window in windows)
    assert np.concatenate([window.samples for window in windows]).shape == samples.shape
    for before, after in zip(windows, windows[1:], strict=False):
        assert after.offset_s == before.offset_s + before.duration_s
        assert not samples[int(after.offset_s * RATE)]  # each cut lies in a pause
