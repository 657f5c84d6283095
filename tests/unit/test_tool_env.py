"""scripts/tool_env.sh, the one helper behind every cached tool environment (peers, linters, the
GPU environment): installs a lock once, again only when the lock changes, and says where."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def tool_env(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "LORA_SERVING_CACHE": str(cache)}
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "tool_env.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )


def test_installs_once_per_lock_and_prints_the_folder(tmp_path):
    lock = tmp_path / "demo.txt"
    lock.write_text("# a lock with nothing pinned\n")
    cache = tmp_path / "cache"
    first = tool_env("--bytecode", "demo", str(lock), cache=cache)
    folder = cache / "demo"
    assert first.stdout.strip() == str(folder)
    assert "demo: installing 0 pinned packages" in first.stderr
    assert (folder / "bin" / "python").exists() and (folder / ".bytecode").is_file()
    stamps = sorted(path.name for path in folder.glob(".lock-*"))
    assert len(stamps) == 1

    again = tool_env("--bytecode", "demo", str(lock), cache=cache)
    assert again.stdout.strip() == str(folder) and "installing" not in again.stderr

    lock.write_text("# a lock with nothing pinned, changed\n")
    changed = tool_env("demo", str(lock), cache=cache)
    assert "installing" in changed.stderr
    new_stamps = sorted(path.name for path in folder.glob(".lock-*"))
    assert len(new_stamps) == 1 and new_stamps != stamps  # the old environment is gone
    assert not (folder / ".bytecode").exists()  # not asked for this time


def test_dir_puts_the_environment_elsewhere(tmp_path):
    lock = tmp_path / "demo.txt"
    lock.write_text("\n")
    result = tool_env("--quiet", "--dir", str(tmp_path / "here"), "demo", str(lock), cache=tmp_path)
    assert result.stdout.strip() == str(tmp_path / "here")
    assert (tmp_path / "here" / "bin" / "python").exists() and not (tmp_path / "demo").exists()


def test_usage_errors_exit_2(tmp_path):
    for args in (["demo"], ["--nope", "demo", "lock.txt"]):
        result = subprocess.run(
            ["bash", str(REPO / "scripts" / "tool_env.sh"), *args], capture_output=True, text=True
        )
        assert result.returncode == 2 and result.stderr
