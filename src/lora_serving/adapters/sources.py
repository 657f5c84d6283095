"""Where adapters come from, and the private copies the engine reads.

Sources, in order of precedence for a name:
  multi_lora.json   Triton vllm_backend's {"name": "folder"}, written by the operator with the
                    model repository; its folders may lie anywhere (like model.json's `model`).
  adapter roots     each subfolder of a root is an adapter named after it. Dot-folders are
                    skipped, so an adapter written to `.name.tmp` and renamed into place is
                    never seen half-written. Whatever a root holds must resolve inside it: a
                    symlink (folder or file) pointing out of the root is refused.
  control requests  `load name path` names a folder inside a root (see adapters.control).

The engine never reads an operator's folder: each loaded version is copied into a private
snapshot first and checked there, so what was checked is exactly what is served, and files
replaced or deleted later cannot change or break a version the engine may still load.
"""

import itertools
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lora_serving.adapters.catalog import (
    CONFIG_FILE,
    PICKLE_FILE,
    PICKLE_REFUSED,
    WEIGHTS_FILE,
    check_adapter_name,
)
from lora_serving.errors import ConfigError, InvalidRequest

MULTI_LORA = "multi_lora.json"
ROOT = "root"
CONTROL = "control"
_FILES = (CONFIG_FILE, WEIGHTS_FILE, PICKLE_FILE)


@dataclass(frozen=True)
class Candidate:
    """An adapter folder a source offers; `fingerprint` changes whenever one of its files does."""

    name: str
    folder: Path  # resolved
    source: str
    fingerprint: tuple
    root: Path | None = None  # the configured root that confines it; None for multi_lora.json


@dataclass(frozen=True)
class Refusal:
    source: str
    message: str


@dataclass
class SourceScan:
    candidates: dict[str, Candidate] = field(default_factory=dict)
    refused: dict[str, Refusal] = field(default_factory=dict)  # name -> why it is not considered
    # Sources that could not be read this time ("multi_lora.json" or a root as configured) ->
    # why: their adapters are kept, not removed.
    unreadable: dict[str, str] = field(default_factory=dict)


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


class AdapterSources:
    def __init__(self, multi_lora: Path | None, roots: tuple[Path, ...]):
        self.multi_lora = multi_lora
        self.roots = tuple(Path(root) for root in roots)

    def scan(self) -> SourceScan:
        """Every source's adapters now; a name offered twice is refused the second time."""
        scan = SourceScan()
        if self.multi_lora is not None and self.multi_lora.exists():
            self._scan_multi_lora(scan)
        for root in self.roots:
            self._scan_root(root, scan)
        return scan

    def _offer(self, scan: SourceScan, candidate: Candidate, where: str) -> None:
        taken = scan.candidates.get(candidate.name)
        if taken is not None:
            message = (
                f"adapter '{candidate.name}' in {where} is also provided by {_describe(taken)}; "
                "the first one is served"
            )
            scan.refused.setdefault(candidate.name, Refusal(candidate.source, message))
            return
        scan.candidates[candidate.name] = candidate

    def _scan_multi_lora(self, scan: SourceScan) -> None:
        path = self.multi_lora
        try:
            entries = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            scan.unreadable[MULTI_LORA] = f"{path}: cannot read adapter list: {err}"
            return
        if not isinstance(entries, dict):
            scan.unreadable[MULTI_LORA] = (
                f'{path}: must be a JSON object {{"adapter name": "folder"}}'
            )
            return
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
            self._offer(scan, Candidate(name, real, MULTI_LORA, fingerprint(real)), str(path))

    def _scan_root(self, root: Path, scan: SourceScan) -> None:
        try:
            real_root = root.resolve(strict=True)
            entries = sorted(os.scandir(real_root), key=lambda entry: entry.name)
        except OSError as err:
            scan.unreadable[str(root)] = (
                f"adapter root {root} cannot be read: {err.strerror or err}"
            )
            return
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_dir():  # follows symlinks
                continue
            try:
                check_adapter_name(entry.name)
                real = confine(Path(entry.path), real_root)
            except (InvalidRequest, ConfigError) as err:
                scan.refused[entry.name[:80]] = Refusal(ROOT, f"{root}/{entry.name}: {err}")
                continue
            candidate = Candidate(entry.name, real, ROOT, fingerprint(real), root)
            self._offer(scan, candidate, f"root {root}")

    def locate(self, name: str, path: str) -> Candidate:
        """A folder named by a control request: absolute, or relative to the first root; it
        must lie inside a root."""
        check_adapter_name(name)
        if not self.roots:
            raise InvalidRequest(
                "no adapter roots are configured (serving.adapters.roots in model.json); "
                "runtime loads are limited to folders inside them"
            )
        folder = Path(path)
        if not folder.is_absolute():
            folder = self.roots[0] / folder
        real = folder.resolve()
        for root in self.roots:
            real_root = root.resolve()
            if _inside(real, real_root):
                if not real.is_dir():
                    raise InvalidRequest(f"adapter folder {folder} does not exist")
                try:
                    confine(folder, real_root)
                except ConfigError as err:
                    raise InvalidRequest(str(err)) from None
                return Candidate(name, real, CONTROL, fingerprint(real), root)
        roots = ", ".join(str(root) for root in self.roots)
        raise InvalidRequest(
            f"adapter folder {folder} resolves to {real}, outside the adapter roots ({roots})"
        )

    def describe_roots(self) -> list[dict]:
        return [{"path": str(root), "exists": root.is_dir()} for root in self.roots]


def _describe(candidate: Candidate) -> str:
    if candidate.source == ROOT:
        return f"root {candidate.root}"
    return candidate.source


class Snapshots:
    """Private copies of adapter folders, one per loaded version, removed when it is dropped."""

    def __init__(self, parent: Path | None, label: str):
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix=f"lora-adapters-{label}-", dir=parent))
        self._names = itertools.count()

    def take(self, candidate: Candidate, int_id: int) -> Path:
        """Copy the adapter's config and safetensors weights (nothing else is ever read)."""
        source = candidate.folder
        if not (source / WEIGHTS_FILE).exists() and (source / PICKLE_FILE).exists():
            raise ConfigError(f"adapter '{candidate.name}' ({source})", [PICKLE_REFUSED])
        real_root = candidate.root.resolve() if candidate.root is not None else None
        target = self.folder / f"{candidate.name}@{int_id}"
        target.mkdir()
        try:
            for name in (CONFIG_FILE, WEIGHTS_FILE):
                if (source / name).exists():
                    real = (source / name).resolve()
                    if real_root is not None and not _inside(real, real_root):
                        raise ConfigError(str(source), [f"{name} links outside the adapter root"])
                    _copy_file(real, target / name)
                    (target / name).chmod(0o444)  # what was checked is not to be edited
        except OSError as err:
            self.remove(target)
            raise ConfigError(str(source), [f"cannot copy the adapter: {err}"]) from None
        except ConfigError:
            self.remove(target)
            raise
        return target

    def remove(self, snapshot: Path) -> None:
        if snapshot.parent == self.folder:
            shutil.rmtree(snapshot, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _copy_file(source: Path, target: Path) -> None:
    """Copy a resolved file; O_NOFOLLOW refuses a symlink swapped in since it was resolved."""
    descriptor = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(descriptor, "rb") as reader, open(target, "xb") as writer:
        shutil.copyfileobj(reader, writer, 1 << 20)
