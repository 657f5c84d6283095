"""Virtual environments for the tools the bench measures us against, never .venv.

As scripts/lint_deploy.sh installs its linters: a pinned lock under requirements/ is installed
with `--no-deps` into ${LORA_SERVING_CACHE:-~/.cache/lora-serving}/<name>, once, and again only
when the lock changes (a stamp file named after the lock's hash), then compiled to bytecode. uv
(from .venv) when there is one, else venv + pip. The installer's own progress lines go to `log`
as they come.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from lora_serving.launcher import REPO_ROOT


def cache_dir() -> Path:
    return Path(os.environ.get("LORA_SERVING_CACHE", Path.home() / ".cache" / "lora-serving"))


def stamp_name(lock: Path) -> str:
    return ".lock-" + hashlib.sha256(lock.read_bytes()).hexdigest()[:16]


def _run(command: list[str], log: Callable[[str], None]) -> None:
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    lines = []
    for line in process.stdout:
        lines.append(line.rstrip())
        if line.strip():
            log(f"      {line.rstrip()[:160]}")
    if process.wait():
        tail = "\n".join(lines[-20:])
        raise RuntimeError(f"{' '.join(command[:4])} ... failed ({process.returncode}):\n{tail}")


def ensure(name: str, lock: Path, log: Callable[[str], None]) -> Path:
    """The python of environment `name` with `lock` installed (installing it if needed)."""
    folder = cache_dir() / name
    python = folder / "bin" / "python"
    stamp = folder / stamp_name(lock)
    if stamp.is_file() and python.exists():
        compile_bytecode(python, log)
        return python
    log(f"   installing {lock.relative_to(REPO_ROOT)} into {folder} (once per lock)")
    started = time.monotonic()
    shutil.rmtree(folder, ignore_errors=True)
    uv = REPO_ROOT / ".venv" / "bin" / "uv"
    base = shutil.which("python3.11") or sys.executable
    if uv.exists():
        _run([str(uv), "venv", "--python", base, str(folder)], log)
        install = [str(uv), "pip", "install", "--python", str(python), "--no-deps", "-r"]
    else:
        _run([base, "-m", "venv", str(folder)], log)
        install = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-deps"]
        install.append("-r")
    _run([*install, str(lock)], log)
    stamp.touch()
    compile_bytecode(python, log)
    log(f"   installed in {time.monotonic() - started:.0f} s")
    return python


def compile_bytecode(python: Path, log: Callable[[str], None]) -> None:
    """Once per environment, as scripts/peer_env.sh does: uv writes no bytecode, and with
    PYTHONDONTWRITEBYTECODE set every run of the tool compiled its imports again. A few
    packaged files are not Python 3.11 (templates): their errors are expected."""
    done = python.parent.parent / ".bytecode"
    if done.is_file():
        return
    log("   compiling bytecode (once)")
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    subprocess.run([str(python), "-m", "compileall", "-q", "-j", "0", purelib], capture_output=True)
    done.touch()
