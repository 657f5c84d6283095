"""P5's baseline: what a user would otherwise run, transformers' automatic-speech-recognition
pipeline on the same whisper-base folder and the same clips, float32, greedy, forced to decode as
many tokens as the served requests (min_new_tokens = max_new_tokens, as ignore_eos does there).

Real-time factor = seconds of audio transcribed / wall seconds.
"""

import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def cores_in_bind(bind: str | None, available: int) -> int:
    """Cores named by VLLM_CPU_OMP_THREADS_BIND ("0", "0-3", "0,2,4-5"; "auto"/"" = all)."""
    if not bind or bind in ("auto", "all", "nobind"):
        return available
    count = 0
    for part in bind.split("|")[0].split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)-(\d+)", part)
        if match:
            count += int(match.group(2)) - int(match.group(1)) + 1
        elif part.isdigit():
            count += 1
    return max(1, count) if count else available


@dataclass(frozen=True)
class HfRun:
    audio_s: float
    wall_s: float

    @property
    def rtf(self) -> float:
        return self.audio_s / self.wall_s


class HfWhisper:
    def __init__(self, model_dir: Path, *, device: str = "cpu", threads: int = 0):
        import torch
        from transformers import pipeline

        self.threads = threads
        self.device = device
        self.pipe = pipeline(
            "automatic-speech-recognition",
            model=str(model_dir),
            dtype=torch.float32,
            device=device,
        )

    def transcribe(
        self, clips: list[np.ndarray], *, max_tokens: int, language: str, batch_size: int
    ) -> HfRun:
        import torch

        previous = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            # The pipeline pops keys from its input dicts: a fresh dict per call.
            inputs = [{"raw": clip, "sampling_rate": 16_000} for clip in clips]
            started = time.perf_counter()
            self.pipe(
                inputs,
                batch_size=batch_size,
                generate_kwargs={
                    "language": language,
                    "task": "transcribe",
                    "max_new_tokens": max_tokens,
                    "min_new_tokens": max_tokens,
                    "num_beams": 1,
                    "do_sample": False,
                },
            )
            wall = time.perf_counter() - started
        finally:
            torch.set_num_threads(previous)
        return HfRun(audio_s=sum(clip.size for clip in clips) / 16_000, wall_s=wall)
