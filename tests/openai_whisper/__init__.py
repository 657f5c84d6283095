"""openai-whisper as the reference (tests/openai_whisper/reference_words.py in its own
environment) on PEFT-merged weights converted by convert.py. Called from .venv's tests."""

import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "scripts" / "openai_whisper.sh"


def install_reference_env(request) -> None:
    """Installs openai-whisper's environment on first use (minutes: torch), its progress shown
    past pytest's capture, as the openai SDK's fixture does."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        subprocess.run(["bash", str(RUNNER), "--install-only"], check=True, timeout=1200)


def reference_transcribe(runs: list[tuple[Path, np.ndarray, dict]], timeout_s: int = 900) -> list:
    """openai-whisper's transcribe() of each (checkpoint, 16 kHz samples, options) run, in one
    process (each checkpoint loads once): transcribe()'s own result dicts."""
    with tempfile.TemporaryDirectory() as folder:
        jobs = []
        for index, (checkpoint, samples, options) in enumerate(runs):
            audio = Path(folder) / f"{index}.npy"
            np.save(audio, np.asarray(samples, dtype=np.float32))
            jobs.append({"checkpoint": str(checkpoint), "audio": str(audio), "options": options})
        job_file = Path(folder) / "job.json"
        job_file.write_text(json.dumps({"runs": jobs}))
        done = subprocess.run(
            ["bash", str(RUNNER), str(Path(__file__).parent / "reference_words.py"), str(job_file)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"openai-whisper reference failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


def run_in_reference_env(script: Path, *args: str, stdin: str = "", timeout_s: int = 300) -> str:
    """stdout of a script run with openai-whisper's environment's python."""
    done = subprocess.run(
        ["bash", str(RUNNER), str(script), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{script.name} failed in openai-whisper's environment:\n{done.stderr[-4000:]}"
        )
    return done.stdout
