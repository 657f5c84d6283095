"""Adapters in folders on the server's disk: multi_lora.json's entries and folder roots.

A folder root's subfolders are adapters named after them. Dot-folders are skipped, so an
adapter written to `.name.tmp` and renamed into place is never seen half-written. Whatever a
root holds must resolve inside it: a symlink (folder or file) pointing out of the root is
refused, when scanned and again when copied.
"""

import json
import os
import shutil
from pathlib import Path

from lora_serving.adapters.catalog import (
    CONFIG_FILE,
    PICKLE_FILE,
    PICKLE_REFUSED,
    WEIGHTS_FILE,
    check_adapter_name,
)
from lora_serving.adapters.sources import (
    CONTROL,
    MULTI_LORA,
    ROOT,
    Candidate,
    Refusal,
    SourceScan,
)
from lora_serving.errors import ConfigError, InvalidRequest

_FILES = (CONFIG_FILE, WEIGHTS_FILE, PICKLE_FILE)


def fingerprint(folder: Path) -> tuple:
    """(folder, and per file: inode, size, mtime), following symlinks; None for a missing file."""
    stats = []
    for name in _FILES:
        try:
            st = os.stat(folder / name)
            stats.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append(None)
    return (str(folder), *stats)


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def confine(folder: Path, root: Path) -> Path:
    """The folder's real path if it and its adapter files resolve inside `root` (resolved)."""
    real = folder.resolve()
    if not _inside(real, root):
        raise ConfigError(f"{folder}", [f"resolves to {real}, outside the adapter root {root}"])
    for name in _FILES:
        file = real / name
        if file.exists() and not _inside(file.resolve(), root):
            raise ConfigError(f"{folder}", [f"{name} links outside the adapter root {root}"])
    return real


def copy_adapter(candidate: Candidate, target: Path) -> None:
    """Copy the adapter's config and safetensors weights (nothing else is ever read)."""
    source = Path(candidate.origin)
    if not (source / WEIGHTS_FILE).exists() and (source / PICKLE_FILE).exists():
        raise ConfigError(f"adapter '{candidate.name}' ({source})", [PICKLE_REFUSED])
    real_root = Path(candidate.root).resolve() if candidate.root is not None else None
    try:
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if (source / name).exists():
                real = (source / name).resolve()
                if real_root is not None and not _inside(real, real_root):
                    raise ConfigError(str(source), [f"{name} links outside the adapter root"])
                _copy_file(real, target / name)
    except OSError as err:
        raise ConfigError(str(source), [f"cannot copy the adapter: {err}"]) from None


def _copy_file(source: Path, target: Path) -> None:
    """Copy a resolved file; O_NOFOLLOW refuses a symlink swapped in since it was resolved."""
    descriptor = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(descriptor, "rb") as reader, open(target, "xb") as writer:
        shutil.copyfileobj(reader, writer, 1 << 20)


class MultiLoraFile:
    """vllm_backend's multi_lora.json: {"adapter name": "folder"}, folders relative to it."""

    key = MULTI_LORA

    def __init__(self, path: Path):
        self.path = path

    def scan(self) -> SourceScan:
        scan, path = SourceScan(), self.path
        try:
            entries = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            scan.unreadable[MULTI_LORA] = f"{path}: cannot read adapter list: {err}"
            return scan
        if not isinstance(entries, dict):
            scan.unreadable[MULTI_LORA] = (
                f'{path}: must be a JSON object {{"adapter name": "folder"}}'
            )
            return scan
        for name, folder in entries.items():
            try:
                check_adapter_name(name)
            except InvalidRequest as err:
                scan.refused[str(name)[:80]] = Refusal(MULTI_LORA, f"{path}: {err}")
                continue
            real = (path.parent / str(folder)).resolve()
            if not real.is_dir():
                message = f"adapter '{name}' ({path}): folder {real} does not exist"
                scan.refused[name] = Refusal(MULTI_LORA, message)
                continue
            scan.candidates[name] = Candidate(
                name, real, MULTI_LORA, fingerprint(real), provider=self
            )
        return scan

    def materialise(self, candidate: Candidate, folder: Path) -> None:
        copy_adapter(candidate, folder)


class FolderRoot:
    """A folder whose subfolders are adapters named after them."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.key = str(self.root)

    def scan(self) -> SourceScan:
        scan, root = SourceScan(), self.root
        try:
            real_root = root.resolve(strict=True)
            entries = sorted(os.scandir(real_root), key=lambda entry: entry.name)
        except OSError as err:
            scan.unreadable[self.key] = f"adapter root {root} cannot be read: {err.strerror or err}"
            return scan
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_dir():  # follows symlinks
                continue
            try:
                check_adapter_name(entry.name)
                real = confine(Path(entry.path), real_root)
            except (InvalidRequest, ConfigError) as err:
                scan.refused.setdefault(
                    entry.name[:80], Refusal(ROOT, f"{root}/{entry.name}: {err}")
                )
                continue
            scan.candidates[entry.name] = Candidate(
                entry.name, real, ROOT, fingerprint(real), root, provider=self
            )
        return scan

    def materialise(self, candidate: Candidate, folder: Path) -> None:
        copy_adapter(candidate, folder)

    def join(self, relative: str) -> str:
        return str(self.root / relative)

    def locate(self, name: str, path: str) -> Candidate | None:
        if "://" in path:
            return None
        folder = Path(path)
        real, real_root = folder.resolve(), self.root.resolve()
        if not _inside(real, real_root):
            return None
        if not real.is_dir():
            raise InvalidRequest(f"adapter folder {folder} does not exist")
        try:
            confine(folder, real_root)
        except ConfigError as err:
            raise InvalidRequest(str(err)) from None
        return Candidate(name, real, CONTROL, fingerprint(real), self.root, provider=self)

    def describe(self) -> dict:
        return {"path": self.key, "exists": self.root.is_dir()}
