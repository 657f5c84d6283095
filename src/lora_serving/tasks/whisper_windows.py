"""Whisper hears 30 s at a time: how a row's recording is decoded window by window.

Plain transcripts (`decode_windows`), as vLLM's speech-to-text server does it: the recording is
cut beforehand at quiet moments, every window is its own engine request and all of them run at
once; their text is handed out in recording order.

With timestamps (`decode_seeking`), as openai-whisper's long-form transcription does it: one
window at a time, each starting where the previous one's last complete segment ended. A
sentence cut by a window's edge is dropped there and heard whole in the next window, so no
speech falls between windows, and segment times are exact across them. Text is handed out one
complete segment at a time.

Both yield the row's chunks: cumulative `text` with the new part in `delta`; the last chunk is
finished and holds the whole transcript.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np

from lora_serving.audio import WHISPER_SAMPLE_RATE, WINDOW_SECONDS, AudioWindow
from lora_serving.jobs import GenerationChunk
from lora_serving.tasks.whisper_timestamps import SECONDS_PER_TIMESTAMP, WindowReading

# A window's samples -> the chunks of its decoding (whisper_quality.decode_window), the last one
# finished; with timestamps, also the tokens said before it (condition_on_previous_text).
WindowDecoder = Callable[..., AsyncIterator[GenerationChunk]]
# With word timestamps: a window's segments (start, end in seconds of the recording, text
# `tokens`) -> the same with `words`, times refined (whisper_words.add_word_timestamps; the
# times openai-whisper's steps gave, before any further refinement, in `aligned`);
# returns openai-whisper's last word end (whisper_words.last_word_end), None without words.
WindowAligner = Callable[[np.ndarray, list[dict], float], Awaitable[float | None]]
FRAMES_PER_SECOND = 100  # openai-whisper's mel frames: where a seek may land
SAMPLES_PER_FRAME = WHISPER_SAMPLE_RATE // FRAMES_PER_SECOND
# A tail shorter than this is not worth a window of its own (one 20 ms timestamp step is less).
MIN_WINDOW_SAMPLES = WHISPER_SAMPLE_RATE // 10


class Stitcher:
    """The windows' chunks, in any order -> the row's chunks in recording order."""

    def __init__(self, count: int, *, separator: str):
        self.separator = separator
        self.latest: list[GenerationChunk | None] = [None] * count
        self.sent = ""

    @property
    def done(self) -> bool:
        return all(chunk is not None and chunk.finished for chunk in self.latest)

    def add(self, index: int, chunk: GenerationChunk) -> GenerationChunk | None:
        """Record a window's chunk; return the row's next chunk if there is anything new."""
        self.latest[index] = chunk
        text = self._text_in_order()
        if self.done:
            return self._final(text)
        if not text.startswith(self.sent) or len(text) == len(self.sent):
            return None
        delta, self.sent = text[len(self.sent) :], text
        return GenerationChunk(text, delta, [], [], 0)

    def _text_in_order(self) -> str:
        """Finished windows from the first on, plus the partial text of the next one."""
        parts = []
        for chunk in self.latest:
            if chunk is None:
                break
            parts.append(chunk.text.strip())
            if not chunk.finished:
                break
        return self.separator.join(part for part in parts if part)

    def _final(self, text: str) -> GenerationChunk:
        delta = text[len(self.sent) :] if text.startswith(self.sent) else text
        return _joined(self.latest, text, delta)


async def decode_windows(
    windows: list[AudioWindow], *, decode_window: WindowDecoder, separator: str
) -> AsyncIterator[GenerationChunk]:
    """Run every window's engine request at once; yield the row's chunks in recording order.

    The first failing window fails the row, and the other windows' requests are cancelled
    (the engine host aborts them in the engine).
    """
    arrivals: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, window: AudioWindow) -> None:
        try:
            async for chunk in decode_window(window.samples):
                arrivals.put_nowait((index, chunk))
        except Exception as err:  # handed to the consumer, which raises it for the row
            arrivals.put_nowait((index, err))

    stitcher = Stitcher(len(windows), separator=separator)
    pumps = [asyncio.create_task(pump(index, window)) for index, window in enumerate(windows)]
    try:
        while not stitcher.done:
            index, item = await arrivals.get()
            if isinstance(item, Exception):
                raise item
            if (chunk := stitcher.add(index, item)) is not None:
                yield chunk
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


async def decode_seeking(
    samples: np.ndarray,
    *,
    decode_window: WindowDecoder,
    read: Callable[[list[int]], WindowReading],
    decode: Callable[[list[int]], str],
    separator: str,
    segments: list[dict],
    outcomes: list,
    condition_on_previous_text: bool,
    initial_prompt: list[int],
    timestamp_begin: int,
    align: WindowAligner | None = None,
) -> AsyncIterator[GenerationChunk]:
    """Decode window after window from where the last one's speech ended; fill `segments`.

    `segments` receives {start, end, text} in seconds of the whole recording, plus the fields
    of the window's accepted attempt (`outcomes`, filled by `decode_window`: temperature,
    avg_logprob, compression_ratio, no_speech_prob). A silent window adds nothing and is
    skipped whole. Each window is told `initial_prompt` and the segments said before it, each
    as its tokens between its two timestamp tokens (openai-whisper's and transformers' form)
    (`decode_window(samples, previous)`), back to the last reset: openai-whisper resets after
    every window without `condition_on_previous_text`, and after a window decoded above
    temperature 0.5.

    With `align` (word timestamps), each decoded window's segments get `words` and times
    refined by them, and, as openai-whisper does, the next window starts at the last word's end
    unless the window ended on a single timestamp (said in full).
    """
    said: list[int] = list(initial_prompt)  # tokens since the last reset

    def timestamp(seconds: float) -> int:  # window time -> its timestamp token
        return timestamp_begin + round(seconds / SECONDS_PER_TIMESTAMP)

    texts: list[str] = []
    finals: list[GenerationChunk] = []
    window_samples = int(WINDOW_SECONDS * WHISPER_SAMPLE_RATE)
    seek = 0

    def add(found, offset_s: float, quality: dict, timed=None) -> str:
        """Record segments (window time; `timed`: their refined times and words); return the
        text they add to the transcript."""
        before = separator.join(texts)
        for index, (start, end, tokens) in enumerate(found):
            text = decode(tokens).strip()
            # With words, openai-whisper judges the times its words gave (not the refinement's).
            times = (start, end) if timed is None else timed[index].get("aligned", (start, end))
            if cleared(*times, text):
                continue
            said.extend([timestamp(start), *tokens, timestamp(end)])
            texts.append(text)
            segments.append(
                {
                    "start": round(offset_s + start, 2),
                    "end": round(offset_s + end, 2),
                    "text": text,
                    **quality,
                }
            )
            if timed is not None:
                segments[-1].update(_timed_fields(timed[index]))
        return separator.join(texts)[len(before) :]

    while len(samples) - seek >= MIN_WINDOW_SAMPLES or seek == 0:
        window = samples[seek : seek + window_samples]
        offset_s, duration_s = seek / WHISPER_SAMPLE_RATE, len(window) / WHISPER_SAMPLE_RATE
        shown, last, window_first = 0, None, len(segments)
        async for chunk in decode_window(window, list(said)):
            last = chunk
            reading = read(chunk.token_ids)
            closed = reading.closed[: reading.confirmed]  # those certain to stay as read
            # Only when no retry can follow; with words, a window's segments come out together
            # once they are aligned.
            if align is None and not chunk.finished and len(closed) > shown:
                delta = add(closed[shown:], offset_s, {})
                shown = len(closed)
                if delta:
                    yield GenerationChunk(separator.join(texts), delta, [], [], 0)
        finals.append(last)
        outcome = outcomes[-1]
        if outcome.silent:
            seek += len(window)
            continue
        reading = read(last.token_ids)
        found, consumed_s = reading.final(duration_s, cut_short=last.finish_reason == "length")
        timed = None
        if align is not None:
            timed = [
                {"start": offset_s + start, "end": offset_s + end, "tokens": list(tokens)}
                for start, end, tokens in found
            ]
            end_s = await align(window, timed, offset_s)
        streamed = len(segments)
        new_timed = None if timed is None else timed[shown:]
        if delta := add(found[shown:], offset_s, outcome.fields(), new_timed):
            yield GenerationChunk(separator.join(texts), delta, [], [], 0)
        for segment in segments[window_first:streamed]:  # streamed before the outcome
            segment.update(outcome.fields())
        if not condition_on_previous_text or outcome.temperature > 0.5:
            said.clear()
        next_seek = seek + max(1, round(consumed_s * WHISPER_SAMPLE_RATE))
        if timed is not None and not reading.ends_after_text:
            if end_s is not None and end_s > offset_s:  # openai-whisper: frames of 10 ms
                next_seek = round(end_s * FRAMES_PER_SECOND) * SAMPLES_PER_FRAME
        seek = next_seek
    text = separator.join(texts)
    yield _joined(finals, text, "")


def cleared(start: float, end: float, text: str) -> bool:
    """openai-whisper's transcribe() clears a segment that is instantaneous (its times after
    the words refined them, with word timestamps) or holds no text: it keeps neither its text,
    its words nor its tokens, so neither the transcript nor the next window's prompt has it."""
    return start == end or not text.strip()


def _timed_fields(timed: dict) -> dict:
    """A segment's times refined by its words (openai-whisper's rounding), and the words."""
    return {
        "start": round(timed["start"], 2),
        "end": round(timed["end"], 2),
        "words": timed["words"],
    }


def _joined(chunks: list[GenerationChunk], text: str, delta: str) -> GenerationChunk:
    """The row's final chunk: the whole text and every window's tokens, in order."""
    reasons = [chunk.finish_reason for chunk in chunks]
    return GenerationChunk(
        text=text,
        delta=delta,
        token_ids=[token for chunk in chunks for token in chunk.token_ids],
        logprobs=[value for chunk in chunks for value in chunk.logprobs],
        num_prompt_tokens=sum(chunk.num_prompt_tokens for chunk in chunks),
        finish_reason="length" if "length" in reasons else reasons[-1],
    )
