"""Virtual environments for the tools the bench measures us against, never .venv.

scripts/tool_env.sh, the one helper for tool environments, does the work: a pinned lock under
requirements/ installed with `--no-deps` into ${LORA_SERVING_CACHE:-~/.cache/lora-serving}/<name>,
once, and again only when the lock changes, then compiled to bytecode. Its progress lines go to
`log` as they come.
"""

import subprocess
from collections.abc import Callable
from pathlib import Path

from lora_serving.launcher import REPO_ROOT

TOOL_ENV = REPO_ROOT / "scripts" / "tool_env.sh"


def ensure(name: str, lock: Path, log: Callable[[str], None]) -> Path:
    """The python of environment `name` with `lock` installed (installing it if needed)."""
    process = subprocess.Popen(
        ["bash", str(TOOL_ENV), "--bytecode", name, str(lock)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    lines = []
    for line in process.stderr:
        lines.append(line.rstrip())
        if line.strip():
            log(f"      {line.rstrip()[:160]}")
    folder = process.stdout.read().strip()
    if process.wait():
        tail = "\n".join(lines[-20:])
        raise RuntimeError(f"{TOOL_ENV.name} {name} failed ({process.returncode}):\n{tail}")
    return Path(folder) / "bin" / "python"
