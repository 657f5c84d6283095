"""Word error rate of whisper_lora next to faster-whisper, on the same whisper-base weights and
the same espeak-ng sentences, at the same settings (`make bench BENCH_ARGS="--models wer"`;
config `"wer_model": "whisper-tiny.en"` compares the second real size the same way).

Settings, each sent to both sides:
  defaults  whisper_lora: no sampling_parameters (its model.json defaults: greedy, temperature
            fallback 0.0, 0.2, ..., 1.0, compression ratio 2.4, log-prob -1, no-speech 0.6,
            suppression on, condition_on_previous_text, no VAD, plain text);
            faster-whisper: transcribe() with exactly those values, beam_size 1, best_of 1,
            without_timestamps (its own defaults are beam 5, best_of 5, timestamps on).
  beam5     the same with beam_size 5 on both sides (ours: its default beam_rule, faster-whisper's).
  beam5-transformers  beam 5 again, ours with beam_rule "transformers" (transformers' search).
Both sides get language "en" and the same 16 kHz WAV files (espeak-ng's speech resampled once by
the server's own resampler), one request at a time (concurrency 1) after one untimed warm-up
request per setting; a setting's time is the sum of its requests' wall times (ours: gRPC send to
the final response, file decoding on the server included; faster-whisper: transcribe() and its
segments, file decoding included). faster-whisper runs float32 on the installed CTranslate2
whisper-base (the folder we convert from) in its own virtual environment, with as many
CTranslate2 threads as cores whisper_lora's engine is bound to.
"""

import json
import os
import subprocess
import time
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lora_serving.tasks.whisper_options import DEFAULTS
from lora_tools.finetune import corpus, metrics

PEER_LOCK = "requirements/faster-whisper.txt"
PEER_SCRIPT = Path(__file__).with_name("faster_whisper_peer.py")
SAMPLE_RATE = 16_000

SENTENCES = (
    *corpus.ORDINARY_SENTENCES,
    "The quick brown fox jumps over the lazy dog.",
    "How much does a return ticket to Edinburgh cost?",
    "Our flight was delayed by almost three hours.",
    "He forgot his umbrella at the restaurant again.",
    "The children built a sandcastle near the water.",
    "Turn left at the second traffic light, then go straight on.",
    "This coffee is far too hot to drink right now.",
    "The library closes at eight o'clock on weekdays.",
    "Could you please speak a little more slowly?",
    "The old bridge was repaired after the storm.",
    "She plays the violin in the city orchestra.",
    "We watched a documentary about whales last night.",
    "The report must be finished before Friday.",
    "A cold wind was blowing across the empty field.",
    "Do you know where I left my car keys?",
    "The museum has a new exhibition on ancient Egypt.",
)


@dataclass(frozen=True)
class WerSetting:
    """One row of the table: what whisper_lora is sent and what faster-whisper is called with."""

    name: str
    label: str
    beam_size: int
    beam_rule: str = DEFAULTS["beam_rule"]

    def ours(self) -> dict:
        """sampling_parameters for whisper_lora ({}: the model's own defaults)."""
        given = {"beam_size": self.beam_size, "beam_rule": self.beam_rule}
        return {key: value for key, value in given.items() if value != DEFAULTS[key]}

    def faster_whisper(self) -> dict:
        """Keyword arguments of faster-whisper's WhisperModel.transcribe for the same decoding."""
        return {
            "language": "en",
            "beam_size": self.beam_size,
            "best_of": 1,
            "patience": DEFAULTS["patience"],
            "length_penalty": DEFAULTS["length_penalty"],
            "temperature": list(DEFAULTS["temperature"]),
            "compression_ratio_threshold": DEFAULTS["compression_ratio_threshold"],
            "log_prob_threshold": DEFAULTS["logprob_threshold"],
            "no_speech_threshold": DEFAULTS["no_speech_threshold"],
            "condition_on_previous_text": DEFAULTS["condition_on_previous_text"],
            "suppress_tokens": list(DEFAULTS["suppress_tokens"]),
            "suppress_blank": DEFAULTS["suppress_blank"],
            "without_timestamps": True,
            "vad_filter": DEFAULTS["vad_filter"],
        }


SETTINGS = (
    WerSetting("defaults", "defaults (greedy + temperature fallback)", 1),
    WerSetting("beam5", "beam 5", 5),
    WerSetting("beam5-transformers", "beam 5, beam_rule transformers", 5, "transformers"),
)


def utterances(sentences: tuple[str, ...] = SENTENCES) -> list[corpus.Utterance]:
    """Each sentence with its own voice and speed, cycling through the corpus' lists."""
    voices, speeds = corpus.VOICES, corpus.SPEEDS
    return [
        corpus.Utterance(text, (), voices[i % len(voices)], speeds[(i // 2) % len(speeds)])
        for i, text in enumerate(sentences)
    ]


def write_wav_16k(samples: np.ndarray, path: Path) -> None:
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes(pcm.tobytes())


def speech_files(folder: Path, sentences: tuple[str, ...] = SENTENCES) -> tuple[list[Path], float]:
    """16 kHz WAV files of `sentences` (kept between runs) and their total seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, seconds = [], 0.0
    for utterance in utterances(sentences):
        path = folder / utterance.file_name().replace(".wav", "-16k.wav")
        samples = corpus.load_16k(corpus.synthesise(utterance, folder / "espeak"))
        if not path.exists():
            write_wav_16k(samples, path)
        paths.append(path)
        seconds += samples.size / SAMPLE_RATE
    return paths, seconds


def write_ct2_folder(folder: Path, model: str = "whisper-base") -> Path:
    """The installed CTranslate2 `model` (whisper-base or whisper-tiny.en) as faster-whisper
    loads it (written once), with every BPE merge in tokenizer.json, as we serve it (the
    whisper-base package's lacks `Ġ t`)."""
    from lora_tools.demo.whisper import INSTALLED_CT2_MODELS, mend_tokenizer

    if (folder / "model.bin").is_file():
        mend_tokenizer(folder)  # a folder written before the merges were rebuilt
        return folder
    model_bin, part1 = INSTALLED_CT2_MODELS[model]()
    partial = folder.with_name(folder.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    (partial / "model.bin").write_bytes(model_bin)
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        (partial / name).write_bytes((part1 / name).read_bytes())
    mend_tokenizer(partial)
    partial.rename(folder)
    return folder


# ---- scoring (pure) ----------------------------------------------------------------------------
def word_score(references: list[str], texts: list[str]) -> dict:
    """Word errors over all sentences together, after Whisper's English normaliser."""
    score = metrics.score(references, texts, [() for _ in references])
    return {
        "word_errors": score.word_errors,
        "reference_words": score.reference_words,
        "wer": score.word_error_rate,
    }


def side_result(references: list[str], texts: list[str], seconds: list[float]) -> dict:
    """One side at one setting: transcripts, times and word errors (Whisper's normaliser)."""
    return {
        "texts": list(texts),
        "errors": [
            metrics.edit_distance(metrics.words(r), metrics.words(t))
            for r, t in zip(references, texts, strict=True)
        ],
        "seconds": list(seconds),
        "total_s": float(sum(seconds)),
        **word_score(references, texts),
    }


# ---- measuring ---------------------------------------------------------------------------------
def transcribe_one(url: str, model: str, path: Path, setting: WerSetting) -> str:
    """whisper_lora's transcript of one file (gRPC, language en, `setting`'s decoding)."""
    from lora_client.requests import send, transcription_fields

    fields = transcription_fields(path, language="en", decoding=setting.ours())
    replies = list(send(url, "grpc", model, fields))
    return "".join(r.outputs.get("text_output", [""])[0] for r in replies).strip()


def transcribe_served(url: str, model: str, files: list[Path], setting: WerSetting):
    """whisper_lora's transcripts and per-request seconds, one request at a time."""
    transcribe_one(url, model, files[0], setting)  # warm-up
    texts, seconds = [], []
    for path in files:
        started = time.perf_counter()
        texts.append(transcribe_one(url, model, path, setting))
        seconds.append(time.perf_counter() - started)
    return texts, seconds


def transcribe_faster_whisper(
    python: Path,
    model_dir: Path,
    files: list[Path],
    threads: int,
    job_path: Path,
    log_path: Path,
    settings: dict[str, dict] | None = None,
    *,
    compute_type: str = "float32",
    warm_up: str = "each",
) -> dict:
    """{setting name: {"texts", "seconds", "segments"}} from faster-whisper in its own
    environment; `settings` (name -> transcribe() arguments) defaults to SETTINGS'.
    (faster_whisper_peer.py says what `compute_type` and `warm_up` do.)"""
    job = {
        "model_dir": str(model_dir),
        "threads": threads,
        "files": [str(f) for f in files],
        "settings": settings or {s.name: s.faster_whisper() for s in SETTINGS},
        "compute_type": compute_type,
        "warm_up": warm_up,
    }
    job_path.write_text(json.dumps(job, indent=1))
    with log_path.open("w") as stderr:
        done = subprocess.run(
            [str(python), str(PEER_SCRIPT), str(job_path)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    if done.returncode:
        tail = log_path.read_text()[-2000:]
        raise RuntimeError(f"faster-whisper failed ({done.returncode}); {log_path}:\n{tail}")
    return json.loads(done.stdout)


# A start that stalls (Triton sometimes never reports a loaded model: tests/README.md) is
# given up after this long and tried once more.
STALLED_START_S = 360


def start_served(
    repo: Path,
    model: str,
    out: Path,
    config,
    log,
    result: dict,
    *,
    label: str = "wer",
    dtype: str | None = None,
    weights: str | None = None,
):
    """A ready tritonserver serving `repo` (at `dtype`, LORA_SERVING_DTYPE's choices, and with
    `weights`, LORA_SERVING_WEIGHTS's, if given); one more try, Python stacks kept, if it
    stalls."""
    from lora_serving.launcher import TritonServer
    from lora_tools.bench.processes import free_port

    for attempt in (1, 2):
        server = TritonServer(
            repo,
            http=free_port(),
            grpc=free_port(),
            metrics=free_port(),
            extra_args=["--log-verbose=0"],
            log_path=out / f"tritonserver-{label}{'' if attempt == 1 else '-2'}.log",
            dtype=dtype,
            weights=weights,
        )
        settings = "+".join(filter(None, (dtype, weights)))
        log(f"   starting tritonserver with {model} only" + (f" ({settings})" if settings else ""))
        timeout_s = min(config.server_start_timeout_s, STALLED_START_S)
        try:
            result["server_start_s"] = server.wait_ready(timeout_s=timeout_s)
            return server
        except TimeoutError:
            stacks = out / f"tritonserver-{label}-stacks-{attempt}.txt"
            stacks.write_text(server.python_stacks())
            server.stop()
            if attempt == 2:
                raise
            log(f"   tritonserver not ready after {timeout_s} s (stacks kept); once more")
    raise AssertionError("unreachable")


def use_demo_model(model_json: Path, name: str) -> None:
    """Point a served whisper_lora at demo_models/<name> (no int8 copy: WEIGHTS stays float)."""
    from lora_serving.launcher import REPO_ROOT

    settings = json.loads(model_json.read_text())
    settings["model"] = str(REPO_ROOT / "demo_models" / name)
    settings.get("serving", {}).pop("int8_model", None)
    model_json.write_text(json.dumps(settings, indent=2))


def peer_threads(config, repo: Path, model: str) -> int:
    """faster-whisper's CTranslate2 threads: config.wer_threads, else as many as cores the
    served whisper engine is bound to (VLLM_CPU_OMP_THREADS_BIND in its model.json)."""
    from lora_tools.bench.hf_whisper import cores_in_bind

    served = json.loads((repo / model / "1" / "model.json").read_text())
    bind = served.get("environment", {}).get("VLLM_CPU_OMP_THREADS_BIND")
    return config.wer_threads or cores_in_bind(bind, os.cpu_count() or 1)


def measure(config, out: Path, log, meter) -> dict:
    """The whole part: speech, whisper_lora on a tritonserver of its own (only that model), then
    faster-whisper once the server is stopped. Returns what results.json keeps under "wer"."""
    from lora_serving.launcher import REPO_ROOT
    from lora_tools.bench import peer_env
    from lora_tools.bench.repository import build_served_only

    work = config.results_dir / "work"
    files, audio_s = speech_files(work / "wer-speech")
    references = list(SENTENCES)
    log(f"   {len(files)} espeak-ng sentences, {audio_s:.0f} s of speech")
    result: dict = {
        "sentences": references,
        "audio_s": audio_s,
        "settings": {
            s.name: {
                "label": s.label,
                "ours_parameters": s.ours(),
                "faster_whisper_arguments": s.faster_whisper(),
            }
            for s in SETTINGS
        },
    }
    peer_python = peer_env.ensure("faster-whisper", REPO_ROOT / PEER_LOCK, log)
    model_dir = write_ct2_folder(work / f"ct2-{config.wer_model}", config.wer_model)
    result["model"] = config.wer_model

    repo = work / "repository-wer"
    model = build_served_only(config, "whisper", repo)
    if config.wer_model != "whisper-base":  # the same server, another real size
        use_demo_model(repo / model / "1" / "model.json", config.wer_model)
    threads = peer_threads(config, repo, model)
    result["threads"] = threads
    server = start_served(repo, model, out, config, log, result)
    try:
        url = f"127.0.0.1:{server.grpc}"
        for setting in SETTINGS:
            meter.start()
            texts, seconds = transcribe_served(url, model, files, setting)
            entry = side_result(references, texts, seconds) | {"other_load": meter.stop()}
            result["settings"][setting.name]["ours"] = entry
            log(
                f"    ours      {setting.name:8s} WER {entry['wer']:.3f}  "
                f"{entry['total_s']:.1f} s  {audio_s / entry['total_s']:.2f} audio s/s"
            )
    finally:
        server.stop()
    log(f"   faster-whisper (float32, {threads} CTranslate2 thread(s))")
    meter.start()
    peer = transcribe_faster_whisper(
        peer_python,
        model_dir,
        files,
        threads,
        out / "faster-whisper-job.json",
        out / "faster-whisper.log",
    )
    load = meter.stop()
    for setting in SETTINGS:
        run = peer[setting.name]
        entry = side_result(references, run["texts"], run["seconds"]) | {"other_load": load}
        result["settings"][setting.name]["faster_whisper"] = entry
        log(
            f"    faster-w. {setting.name:8s} WER {entry['wer']:.3f}  "
            f"{entry['total_s']:.1f} s  {audio_s / entry['total_s']:.2f} audio s/s"
        )
    return result
