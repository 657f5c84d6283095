"""Silero VAD frame by frame, for live audio (the front's server_vad).

whisper_lora's vad_filter (lora_serving.tasks.whisper_vad) runs the same Silero model over a
whole recording through silero-vad's torch wrapper. Here the audio arrives 20-100 ms at a time
and the front must not load torch or the model's task code, so the ONNX file the silero-vad
package ships runs on onnxruntime directly: one InferenceSession for the process (its `run` is
thread safe), and each stream keeps its own recurrent state and 64-sample context, which is all
Silero's wrapper keeps between frames.
"""

import functools
import importlib.util
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000
FRAME_SAMPLES = 512  # 32 ms at 16 kHz: what Silero's 16 kHz model takes per call
_CONTEXT = 64


@functools.cache
def _session():
    import onnxruntime

    # The package's location without importing it (its __init__ imports torch).
    spec = importlib.util.find_spec("silero_vad")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"
    options = onnxruntime.SessionOptions()
    options.inter_op_num_threads = 1
    options.intra_op_num_threads = 1  # silero-vad's own setting: a frame is tiny
    return onnxruntime.InferenceSession(
        str(path), sess_options=options, providers=["CPUExecutionProvider"]
    )


def load() -> None:
    """Load the model now (the app's start), not on a session's first frame."""
    _session()


class StreamingVad:
    """Speech probability of each 32 ms frame of one stream, in order."""

    def __init__(self):
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros((1, _CONTEXT), dtype=np.float32)
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)

    def probability(self, frame: np.ndarray) -> float:
        """One frame: FRAME_SAMPLES float32 samples at 16 kHz in [-1, 1]."""
        x = np.concatenate([self._context, frame.reshape(1, FRAME_SAMPLES)], axis=1)
        out, self._state = _session().run(
            None, {"input": x.astype(np.float32), "state": self._state, "sr": self._sr}
        )
        self._context = x[:, -_CONTEXT:]
        return float(out.reshape(-1)[0])


def to_vad_rate(frame: np.ndarray) -> np.ndarray:
    """A 32 ms frame of int16 samples at any rate -> FRAME_SAMPLES float32 at 16 kHz (linear
    interpolation: plenty for a speech detector; the transcribed audio is never resampled here)."""
    samples = frame.astype(np.float32) / 32768.0
    if len(samples) == FRAME_SAMPLES:
        return samples
    positions = np.linspace(0, len(samples) - 1, FRAME_SAMPLES)
    return np.interp(positions, np.arange(len(samples)), samples).astype(np.float32)
