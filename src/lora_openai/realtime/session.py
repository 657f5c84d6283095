"""One live transcription session: its audio, its turns, and their decodes.

Transport and engine agnostic: the router feeds it client events and gives it `send` (a server
event out) and `transcribe` (PCM16 -> text, the file-upload path to whisper_lora).

A turn is the audio from its start to its end: in server_vad mode from the speech start
(lora_openai.realtime.turns) to the silence that ends it; otherwise from the last commit to the
next. While a turn grows, every `partial_every_s` of new audio re-decodes it whole; the stable
prefix (lora_openai.realtime.agreement) goes out as deltas. At the turn's end its in-flight
partial decode is cancelled (superseded) and the turn joins the final queue: one worker decodes
turns in order, sends the rest of the text as a last delta, then the completed event. The queue
is bounded and a client that sends faster than real time is slowed down (the reader waits), so
nothing is buffered without bound. Partial decodes are previews and give way to completed turns
across every session of the front (DecodeBudget).
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from lora_openai.realtime import events
from lora_openai.realtime.agreement import LocalAgreement, continued
from lora_openai.realtime.events import OPENAI, VLLM, ProtocolError, SessionConfig
from lora_openai.realtime.turns import FRAME_MS, SpeechStarted, SpeechStopped, TurnDetector
from lora_openai.realtime.vad import StreamingVad, to_vad_rate

log = logging.getLogger("lora_openai")


@dataclass(frozen=True)
class RealtimeLimits:
    """Per-session limits (lora-openai --realtime-* flags; docs/openai.md)."""

    max_session_s: float = 900.0  # audio seconds one session may send
    max_turn_s: float = 60.0  # audio one turn may buffer; the turn is then ended there
    idle_timeout_s: float = 60.0  # no client event for this long closes the session
    partial_every_s: float = 1.0  # re-decode a growing turn after this much new audio
    max_ahead_s: float = 5.0  # how far ahead of real time a client may send before it waits
    max_pending_turns: int = 4  # ended turns waiting for their decode before the reader waits


class DecodeBudget:
    """The front's partial decodes, across every session: one starts only while fewer than
    `max_partials` run and no session has an ended turn waiting for (or in) its decode. On 2 CPU
    cores, four sessions re-decoding their turns every second kept completed turns waiting
    10 s; under load the text now comes with the turn's end instead of as earlier previews."""

    def __init__(self, max_partials: int = 2):
        self.max_partials = max_partials
        self.partials = 0
        self.sessions: set[LiveSession] = set()

    def partial_may_start(self) -> bool:
        if self.partials >= self.max_partials:
            return False
        return not any(session.final_pending for session in self.sessions)

    def partial_started(self, task: asyncio.Task) -> None:
        self.partials += 1
        task.add_done_callback(self._partial_ended)  # runs for a task cancelled unstarted too

    def _partial_ended(self, _task) -> None:
        self.partials -= 1


class SessionOver(Exception):
    """A limit that ends the session: the router closes the socket with this reason."""


@dataclass
class Turn:
    item_id: str
    start_ms: int
    agreement: LocalAgreement
    previous_item_id: str | None


Send = Callable[[dict], Awaitable[None]]


class Transcribe(Protocol):
    """A turn's audio -> its text (router: through the file-upload path); `final` bills it,
    `prefix` makes the decode continue from that text."""

    def __call__(
        self,
        pcm: bytes,
        rate: int,
        config: SessionConfig,
        final: bool,
        *,
        prefix: str | None = None,
    ) -> Awaitable[str]: ...


class LiveSession:
    def __init__(
        self,
        protocol: str,
        config: SessionConfig,
        send: Send,
        transcribe: Transcribe,
        limits: RealtimeLimits,
        budget: DecodeBudget | None = None,
    ):
        self.protocol = protocol
        self.config = config
        self.limits = limits
        self._send = send
        self._transcribe = transcribe
        self._buffer = bytearray()  # PCM16 at config.rate from _buffer_ms on
        self._buffer_ms = 0
        self._received_samples = 0
        self._first_audio: float | None = None
        self._vad = StreamingVad()
        self._vad_pending = bytearray()
        self._detector = TurnDetector(config.turn_detection) if config.turn_detection else None
        self._turn: Turn | None = None
        self._started = protocol == OPENAI  # vLLM's: decoding starts at the first commit
        self._last_item: str | None = None
        self._partial: asyncio.Task | None = None
        self._partial_bytes = 0
        self._finals: asyncio.Queue = asyncio.Queue(maxsize=limits.max_pending_turns)
        self._decoding_final = False
        self._budget = budget or DecodeBudget()
        self._budget.sessions.add(self)
        self._worker = asyncio.create_task(self._final_worker())

    @property
    def final_pending(self) -> bool:
        """An ended turn waits for its decode, or is being decoded."""
        return self._decoding_final or not self._finals.empty()

    # ---- positions ------------------------------------------------------------------------------
    @property
    def _bytes_per_ms(self) -> float:
        return self.config.rate * 2 / 1000

    def _offset(self, ms: int) -> int:
        """Byte offset in the buffer of session time `ms` (whole samples)."""
        return int((ms - self._buffer_ms) * self.config.rate // 1000) * 2

    @property
    def _position_ms(self) -> int:
        return self._received_samples * 1000 // self.config.rate

    # ---- client events --------------------------------------------------------------------
    def reconfigure(self, config: SessionConfig) -> None:
        """New settings (rate or turn detection changes restart the buffer)."""
        changed = (config.rate, config.turn_detection) != (
            self.config.rate,
            self.config.turn_detection,
        )
        position_ms = self._position_ms  # at the old rate
        self.config = config
        if changed:
            self._drop_turn()
            self._received_samples = position_ms * config.rate // 1000
            self._reset_buffer()
            vad = config.turn_detection
            self._detector = TurnDetector(vad, position_ms) if vad else None

    async def append(self, pcm: bytes) -> None:
        await self._pace(len(pcm) // 2)
        self._received_samples += len(pcm) // 2
        if self._received_samples / self.config.rate > self.limits.max_session_s:
            raise SessionOver(
                f"the session sent over {self.limits.max_session_s:g} s of audio "
                "(limit realtime_max_session_s)"
            )
        self._buffer += pcm
        if self._detector is not None:
            await self._detect(pcm)
        elif self._turn is None and self._started:
            self._turn = self._new_turn(self._buffer_ms)
        if self._turn is not None:
            turn_s = (len(self._buffer) - self._offset(self._turn.start_ms)) / 2 / self.config.rate
            if turn_s > self.limits.max_turn_s:
                await self._limit_error(
                    f"a turn may buffer at most {self.limits.max_turn_s:g} s of audio "
                    "(limit realtime_max_turn_s): it ends here",
                    "buffer_limit",
                )
                await self.commit(final=self.protocol == VLLM)
                return
            self._maybe_partial()

    async def commit(self, final: bool = False) -> None:
        if self.protocol == VLLM and not final:
            self._started = True  # vLLM's first commit starts the transcription
            if self._turn is None:
                self._turn = self._new_turn(self._buffer_ms)
            return
        if self._turn is None:
            self._turn = self._new_turn(self._buffer_ms)
        end_ms = self._position_ms
        if self.protocol == OPENAI and end_ms - self._turn.start_ms < 100:
            self._turn = None
            raise ProtocolError(
                "buffer too small: a commit needs at least 100 ms of audio",
                "input_audio_buffer_commit_empty",
            )
        await self._end_turn(end_ms)
        if self._detector is not None:
            self._detector.reset(self._position_ms)
        self._started = self.protocol == OPENAI

    async def clear(self) -> None:
        self._drop_turn()
        self._reset_buffer()
        if self._detector is not None:
            self._detector.reset(self._position_ms)
        await self._send(events.openai_event("input_audio_buffer.cleared"))

    async def close(self) -> None:
        """The socket is gone: cancel every decode (their Triton requests are cancelled)."""
        self._budget.sessions.discard(self)
        tasks = [task for task in (self._partial, self._worker) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- turns ----------------------------------------------------------------------------------
    def _new_turn(self, start_ms: int) -> Turn:
        return Turn(events.new_id("item"), start_ms, LocalAgreement(), self._last_item)

    def _reset_buffer(self) -> None:
        self._buffer = bytearray()
        self._buffer_ms = self._position_ms
        self._vad_pending = bytearray()

    def _drop_turn(self) -> None:
        self._cancel_partial()
        self._turn = None

    async def _detect(self, pcm: bytes) -> None:
        self._vad_pending += pcm
        frame_bytes = int(self.config.rate * FRAME_MS / 1000) * 2
        while len(self._vad_pending) >= frame_bytes:
            frame = np.frombuffer(bytes(self._vad_pending[:frame_bytes]), dtype="<i2")
            del self._vad_pending[:frame_bytes]
            found = self._detector.frame(self._vad.probability(to_vad_rate(frame)))
            if isinstance(found, SpeechStarted):
                self._turn = self._new_turn(found.audio_start_ms)
                await self._send(
                    events.openai_event(
                        "input_audio_buffer.speech_started",
                        audio_start_ms=found.audio_start_ms,
                        item_id=self._turn.item_id,
                    )
                )
            elif isinstance(found, SpeechStopped) and self._turn is not None:
                await self._send(
                    events.openai_event(
                        "input_audio_buffer.speech_stopped",
                        audio_end_ms=found.audio_end_ms,
                        item_id=self._turn.item_id,
                    )
                )
                await self._end_turn(found.audio_end_ms)
        if self._turn is None:  # between turns keep only what a next turn's padding may take
            keep_from = (
                self._detector.position_ms - FRAME_MS - self.config.turn_detection.prefix_padding_ms
            )
            if keep_from > self._buffer_ms:
                del self._buffer[: self._offset(keep_from)]
                self._buffer_ms = keep_from

    async def _end_turn(self, end_ms: int) -> None:
        turn, self._turn = self._turn, None
        self._cancel_partial()
        start, end = self._offset(turn.start_ms), self._offset(end_ms)
        pcm = bytes(self._buffer[start:end])
        del self._buffer[:end]
        self._buffer_ms = end_ms
        self._last_item = turn.item_id
        if self.protocol == OPENAI:
            await self._send(
                events.openai_event(
                    "input_audio_buffer.committed",
                    item_id=turn.item_id,
                    previous_item_id=turn.previous_item_id,
                )
            )
        await self._finals.put((turn, pcm, self.config))  # waits while the queue is full

    # ---- decodes --------------------------------------------------------------------------------
    def _maybe_partial(self) -> None:
        turn = self._turn
        turn_bytes = len(self._buffer) - self._offset(turn.start_ms)
        due = turn_bytes - self._partial_bytes >= self.limits.partial_every_s * self.config.rate * 2
        if not due or (self._partial is not None and not self._partial.done()):
            return
        if not self._budget.partial_may_start():
            return  # tried again with the next chunk
        self._partial_bytes = turn_bytes
        pcm = bytes(self._buffer[self._offset(turn.start_ms) :])
        self._partial = asyncio.create_task(self._partial_decode(turn, pcm, self.config))
        self._budget.partial_started(self._partial)

    def _cancel_partial(self) -> None:
        if self._partial is not None and not self._partial.done():
            self._partial.cancel()  # superseded: its Triton request is cancelled
        self._partial = None
        self._partial_bytes = 0

    async def _partial_decode(self, turn: Turn, pcm: bytes, config: SessionConfig) -> None:
        try:
            text = await self._transcribe(pcm, config.rate, config, False)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a partial is only a preview: the final decode reports
            log.info("realtime partial decode failed: %s", err)
            return
        delta = turn.agreement.update(text)
        if delta and self._turn is turn:
            await self._send(self._delta(turn, delta))

    async def _final_worker(self) -> None:
        while True:
            turn, pcm, config = await self._finals.get()
            self._decoding_final = True
            try:
                await self._final_decode(turn, pcm, config)
            finally:
                self._decoding_final = False

    async def _final_decode(self, turn: Turn, pcm: bytes, config: SessionConfig) -> None:
        seconds = len(pcm) / 2 / config.rate
        sent = turn.agreement.sent
        try:
            text = await self._transcribe(pcm, config.rate, config, True)
            if not text.startswith(sent):
                # Two partials agreed on a word the whole turn decodes otherwise: decode it again
                # continuing from what was sent (not billed twice), so no delta is retracted.
                log.warning("realtime turn %s: decoded again after the sent text", turn.item_id)
                rest = await self._transcribe(pcm, config.rate, config, False, prefix=sent)
                text = continued(sent, rest)
        except asyncio.CancelledError:
            raise
        except ProtocolError as err:
            await self._send(events.error_event(self.protocol, err))
            return
        except Exception as err:  # the next turns still get their decode
            log.exception("realtime turn %s: decode failed", turn.item_id)
            failure = ProtocolError(
                f"transcription failed: {err}",
                "transcription_failed",
                error_type="server_error",
            )
            await self._send(events.error_event(self.protocol, failure))
            return
        rest = turn.agreement.finish(text)
        if rest:
            await self._send(self._delta(turn, rest))
        await self._send(self._completed(turn, text, seconds))

    def _delta(self, turn: Turn, delta: str) -> dict:
        if self.protocol == VLLM:
            return {"type": "transcription.delta", "delta": delta}
        return events.openai_event(
            "conversation.item.input_audio_transcription.delta",
            item_id=turn.item_id,
            content_index=0,
            delta=delta,
        )

    def _completed(self, turn: Turn, text: str, seconds: float) -> dict:
        if self.protocol == VLLM:
            return {
                "type": "transcription.done",
                "text": text,
                "usage": {
                    "prompt_tokens": 0,
                    "completion_tokens": 0,
                    "total_tokens": 0,
                    "seconds": round(seconds, 3),
                },
            }
        return events.openai_event(
            "conversation.item.input_audio_transcription.completed",
            item_id=turn.item_id,
            content_index=0,
            transcript=text,
            usage={"type": "duration", "seconds": round(seconds, 3)},
        )

    # ---- limits ---------------------------------------------------------------------------------
    async def _pace(self, samples: int) -> None:
        """Back-pressure: a client ahead of real time by more than max_ahead_s waits here (and
        the socket's own bounded queue then stops reading from it)."""
        now = time.monotonic()
        if self._first_audio is None:
            self._first_audio = now
        ahead = (self._received_samples + samples) / self.config.rate - (now - self._first_audio)
        if ahead > self.limits.max_ahead_s:
            await asyncio.sleep(ahead - self.limits.max_ahead_s)

    async def _limit_error(self, message: str, code: str) -> None:
        await self._send(events.error_event(self.protocol, ProtocolError(message, code)))
