"""Demo folders are written in a private staging folder beside their place and moved there
whole, so an interrupted build never leaves a folder that looks complete, and two builds at
once (parallel test workers) keep one result."""

import os
import shutil
from collections.abc import Sequence
from pathlib import Path


def is_complete(directory: Path, required: Sequence[str]) -> bool:
    return all((directory / name).is_file() for name in required)


def publish(staging_dir: Path, out_dir: Path, required: Sequence[str]) -> None:
    """Move a fully written staging folder into place; if another process won, keep theirs."""
    staging_dir.chmod(0o755)  # mkdtemp makes it private; other workers read these files
    for path in staging_dir.iterdir():
        path.chmod(0o644)
    try:
        os.rename(staging_dir, out_dir)
    except OSError:
        shutil.rmtree(staging_dir)
        if not is_complete(out_dir, required):
            raise FileExistsError(f"{out_dir} exists but is incomplete; remove it") from None
