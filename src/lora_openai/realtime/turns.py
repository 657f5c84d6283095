"""Server VAD turn detection on per-frame speech probabilities (OpenAI's `server_vad`).

Pure bookkeeping over Silero's 32 ms frames (lora_openai.realtime.vad computes them): speech
starts at the first frame at or above `threshold`; it stops once `silence_duration_ms` of frames
in a row are below it. A turn's audio runs from `prefix_padding_ms` before its first speech
frame to the end of its last speech frame plus the silence that ended it, in milliseconds of the
session's audio (OpenAI's audio_start_ms / audio_end_ms).
"""

from dataclasses import dataclass

FRAME_MS = 32  # Silero VAD's frame: 512 samples at 16 kHz


@dataclass(frozen=True)
class ServerVad:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


@dataclass(frozen=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    audio_end_ms: int


class TurnDetector:
    def __init__(self, options: ServerVad, start_ms: int = 0):
        self.options = options
        self.position_ms = start_ms  # end of the frames seen so far
        self.speaking = False
        self._silent_ms = 0
        self._floor_ms = start_ms  # a turn never starts before the end of the previous one

    def frame(self, probability: float) -> SpeechStarted | SpeechStopped | None:
        """One frame's speech probability -> the event it causes, if any."""
        start = self.position_ms
        self.position_ms += FRAME_MS
        if probability >= self.options.threshold:
            self._silent_ms = 0
            if not self.speaking:
                self.speaking = True
                return SpeechStarted(max(self._floor_ms, start - self.options.prefix_padding_ms))
            return None
        if not self.speaking:
            return None
        self._silent_ms += FRAME_MS
        if self._silent_ms >= self.options.silence_duration_ms:
            self.speaking = False
            self._silent_ms = 0
            self._floor_ms = self.position_ms
            return SpeechStopped(self.position_ms)
        return None

    def reset(self, position_ms: int) -> None:
        """Forget the turn in progress (the client cleared or committed the buffer)."""
        self.speaking = False
        self._silent_ms = 0
        self.position_ms = self._floor_ms = position_ms
