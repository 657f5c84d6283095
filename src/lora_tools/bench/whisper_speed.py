"""P7: whisper_lora ÷ faster-whisper throughput, in seconds of audio transcribed per second, on
the same whisper-base weights (the CTranslate2 folder we convert from) and the same speech
(`make bench BENCH_ARGS="--models speed"`).

What a speech team would run instead on a CPU is faster-whisper at int8 (its fastest CPU mode),
so that is the bar; its float32 is measured beside it. Both sides decode plain text with the
same settings (greedy, temperature fallback as model.json's defaults, language "en", no VAD),
as the word-error-rate part's "defaults" row (wer.SETTINGS[0]):

  clips  SENTENCES (54 espeak-ng sentences, a few seconds each), one request per clip:
         whisper_lora at `speed_concurrency` requests in flight vs faster-whisper's transcribe(),
         one clip after another (it has no server; one call at a time is how it is used).
  long   the same clips joined into one recording (~2.5 min, LONG_GAP_S of silence between):
         whisper_lora's one request (its 30 s windows run at once) vs faster-whisper's
         BatchedInferencePipeline (batch_size LONG_BATCH). Both get the same windows: ours are
         cut at the quietest moment (lora_serving.audio.split_windows), and faster-whisper is
         given those as clip_timestamps, since without VAD it cannot cut a long recording itself.

whisper_lora runs on a tritonserver of its own (only that model) once per dtype in
`speed_dtypes` (float32, then bfloat16: the bf16 ÷ float32 figure, then bfloat16 with its int8
weights, "bfloat16+int8": the same arithmetic as faster-whisper's int8 on the linear layers).
Every side runs `repeats` rounds after one untimed warm-up; rates are paired by round.
faster-whisper runs once the server is stopped, with as many CTranslate2 threads as cores
whisper_lora's engine is bound to.
Word error rates (Whisper's English normaliser) of every side on the same clips go beside them.
"""

import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from lora_tools.bench import wer

EXTRA_SENTENCES = (
    "The garden looks beautiful in the early summer.",
    "Please remember to lock the door when you leave.",
    "He has been learning to play the piano for years.",
    "The bakery on the corner sells fresh bread every morning.",
    "We are planning a trip to the mountains next month.",
    "The price of petrol went up again this week.",
    "Can you recommend a good book for the holidays?",
    "The students listened carefully to the teacher.",
    "Our neighbours have a very friendly black dog.",
    "The concert was cancelled because of the storm.",
    "I usually take the bus to work on Mondays.",
    "The doctor told him to drink more water.",
    "Please send me the documents by email tomorrow.",
    "They painted the kitchen a bright shade of yellow.",
    "The river flows slowly through the green valley.",
    "Dinner will be ready in about twenty minutes.",
    "She bought a new pair of shoes for the wedding.",
    "The airport was crowded with holiday travellers.",
    "My grandmother tells wonderful stories about her childhood.",
    "The football match ended in a draw.",
    "We saw a rainbow after the heavy rain.",
    "The hotel room had a lovely view of the sea.",
    "He answered every question in the interview calmly.",
    "The shop will be closed on public holidays.",
    "A small boat was sailing towards the harbour.",
    "Please turn off the lights before going to bed.",
    "The new road will be finished by the end of the year.",
    "Our team won the first prize in the competition.",
    "The soup needs a little more salt and pepper.",
    "They walked along the beach until the sun went down.",
)
SENTENCES = (*wer.SENTENCES, *EXTRA_SENTENCES)
LONG_GAP_S = 0.5
LONG_BATCH = 8  # BatchedInferencePipeline's default batch_size
INT8, FLOAT32 = "int8", "float32"
PEER_TYPES = (INT8, FLOAT32)
DEFAULTS = wer.SETTINGS[0]  # "defaults": greedy, model.json's decoding defaults on both sides


# ---- the long recording --------------------------------------------------------------------------
def join_clips(clips: list[np.ndarray], gap_s: float = LONG_GAP_S) -> np.ndarray:
    """16 kHz clips -> one recording, `gap_s` of silence between them."""
    gap = np.zeros(int(round(gap_s * wer.SAMPLE_RATE)), dtype=np.float32)
    pieces: list[np.ndarray] = []
    for index, clip in enumerate(clips):
        if index:
            pieces.append(gap)
        pieces.append(np.asarray(clip, dtype=np.float32))
    return np.concatenate(pieces)


def clip_timestamps(window_starts_s: list[float], window_lengths: list[int]) -> list[dict]:
    """Our windows as faster-whisper's BatchedInferencePipeline takes them: seconds."""
    return [
        {"start": start, "end": start + length / wer.SAMPLE_RATE}
        for start, length in zip(window_starts_s, window_lengths, strict=True)
    ]


def read_samples(path: Path) -> np.ndarray:
    """A 16 kHz file's samples, decoded as the server decodes what it is sent."""
    from lora_serving.audio import decode_audio_file

    samples, _ = decode_audio_file(path.read_bytes(), max_seconds=math.inf)
    return samples


def long_recording(files: list[Path], path: Path) -> tuple[float, list[dict]]:
    """Writes the joined clips to `path`; returns its seconds and our windows as
    clip_timestamps (cut in the file as written, which is what the server is sent)."""
    from lora_serving.audio import split_windows

    samples = join_clips([read_samples(f) for f in files])
    wer.write_wav_16k(samples, path)
    windows = split_windows(read_samples(path))
    stamps = clip_timestamps([w.offset_s for w in windows], [w.samples.shape[0] for w in windows])
    return samples.size / wer.SAMPLE_RATE, stamps


# ---- scoring (pure) ------------------------------------------------------------------------------
def side_entry(audio_s: float, seconds: list[float], references: list[str], texts: list[str]):
    """One side on one workload: rate per round (audio s / wall s), and the word errors of the
    last round's texts (every round decodes the same way)."""
    return {
        "seconds": list(seconds),
        "rates": [audio_s / s for s in seconds],
        "texts": list(texts),
        **wer.word_score(references, texts),
    }


# ---- measuring -----------------------------------------------------------------------------------
def _transcribe_one(url: str, model: str, path: Path) -> str:
    return wer.transcribe_one(url, model, path, DEFAULTS)


def served_clips(url: str, model: str, files: list[Path], concurrency: int):
    """whisper_lora on every clip, `concurrency` requests in flight: (texts, wall seconds)."""
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        texts = list(pool.map(lambda f: _transcribe_one(url, model, f), files))
    return texts, time.perf_counter() - started


def served_long(url: str, model: str, path: Path) -> tuple[str, float]:
    started = time.perf_counter()
    text = _transcribe_one(url, model, path)
    return text, time.perf_counter() - started


def measure_served(config, out, log, meter, repo, model, dtype, work) -> dict:
    files, clips_s, long_path, long_s, _ = work
    references, long_reference = list(SENTENCES), [" ".join(SENTENCES)]
    concurrency = config.speed_concurrency
    result: dict = {}
    served_dtype, _, weights = dtype.partition("+")  # "bfloat16+int8": int8 weights at bf16
    server = wer.start_served(
        repo,
        model,
        out,
        config,
        log,
        result,
        label=f"speed-{dtype}",
        dtype=served_dtype,
        weights=weights or None,
    )
    try:
        url = f"127.0.0.1:{server.grpc}"
        _transcribe_one(url, model, files[0])  # warm-up
        clip_runs, long_runs = [], []
        meter.start()
        for _ in range(config.repeats):
            clip_runs.append(served_clips(url, model, files, concurrency))
            long_runs.append(served_long(url, model, long_path))
        load = meter.stop()
    finally:
        server.stop()
    result["clips"] = side_entry(clips_s, [s for _, s in clip_runs], references, clip_runs[-1][0])
    result["long"] = side_entry(
        long_s, [s for _, s in long_runs], long_reference, [long_runs[-1][0]]
    )
    result["other_load"] = load
    for kind in ("clips", "long"):
        entry = result[kind]
        log(
            f"    whisper_lora {dtype:8s} {kind:5s} {np.median(entry['rates']):6.2f} audio s/s  "
            f"WER {entry['wer']:.3f}"
        )
    return result


def measure_peer(config, out, log, meter, python, model_dir, threads, compute_type, work) -> dict:
    files, clips_s, long_path, long_s, stamps = work
    arguments = DEFAULTS.faster_whisper()
    # The same arguments (its windows are decoded independently, as ours are in plain text).
    batched = arguments | {"batch_size": LONG_BATCH, "clip_timestamps": stamps}
    rounds = range(config.repeats)

    def run(kind: str, paths: list[Path], options: dict) -> dict:
        return wer.transcribe_faster_whisper(
            python,
            model_dir,
            paths,
            threads,
            out / f"speed-fw-{compute_type}-{kind}.json",
            out / f"faster-whisper-speed-{compute_type}-{kind}.log",
            {f"round{r}": options for r in rounds},
            compute_type=compute_type,
            warm_up="once",
        )

    meter.start()
    clips = run("clips", files, arguments)
    long = run("long", [long_path], batched)
    load = meter.stop()
    last = f"round{config.repeats - 1}"
    result = {
        "clips": side_entry(
            clips_s,
            [sum(clips[f"round{r}"]["seconds"]) for r in rounds],
            list(SENTENCES),
            clips[last]["texts"],
        ),
        "long": side_entry(
            long_s,
            [long[f"round{r}"]["seconds"][0] for r in rounds],
            [" ".join(SENTENCES)],
            long[last]["texts"],
        ),
        "other_load": load,
    }
    for kind in ("clips", "long"):
        entry = result[kind]
        log(
            f"    faster-whisper {compute_type:7s} {kind:5s} "
            f"{np.median(entry['rates']):6.2f} audio s/s  WER {entry['wer']:.3f}"
        )
    return result


def measure(config, out: Path, log, meter) -> dict:
    """The whole part. Returns what results.json keeps under "speed"."""
    from lora_serving.launcher import REPO_ROOT
    from lora_tools.bench import peer_env
    from lora_tools.bench.repository import build_served_only

    folder = config.results_dir / "work"
    files, clips_s = wer.speech_files(folder / "wer-speech", SENTENCES)
    long_path = folder / "speed-long-16k.wav"
    long_s, stamps = long_recording(files, long_path)
    work = (files, clips_s, long_path, long_s, stamps)
    log(
        f"   {len(files)} clips ({clips_s:.0f} s of speech); one recording of {long_s:.0f} s "
        f"in {len(stamps)} windows"
    )

    peer_python = peer_env.ensure("faster-whisper", REPO_ROOT / wer.PEER_LOCK, log)
    model_dir = wer.write_ct2_folder(folder / "ct2-whisper-base")
    repo = folder / "repository-speed"
    model = build_served_only(config, "whisper", repo)
    threads = wer.peer_threads(config, repo, model)
    result: dict = {
        "sentences": list(SENTENCES),
        "clips_audio_s": clips_s,
        "long_audio_s": long_s,
        "long_windows": len(stamps),
        "concurrency": config.speed_concurrency,
        "threads": threads,
        "repeats": config.repeats,
        "ours": {},
        "faster_whisper": {},
    }
    for dtype in config.speed_dtypes:
        result["ours"][dtype] = measure_served(config, out, log, meter, repo, model, dtype, work)
    log(f"   faster-whisper ({threads} CTranslate2 thread(s))")
    for compute_type in PEER_TYPES:
        result["faster_whisper"][compute_type] = measure_peer(
            config, out, log, meter, peer_python, model_dir, threads, compute_type, work
        )
    return result
