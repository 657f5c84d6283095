"""API keys of the OpenAI front: who may call, which model ids, with which limits.

`lora-openai --api-keys-file keys.yaml` (YAML; JSON is YAML too):

  keys:
    - name: acme                     # what logs, metrics and the audit log show (never the key)
      sha256: 9f86d081...            # hex SHA-256 of the key: `printf %s KEY | sha256sum`
      models: ["whisper_lora/acme-*"]  # model ids as glob patterns (fnmatch; `*` crosses `/`)
      admin: false                   # true: may load / unload adapters (/v1/load_lora_adapter)
      limits:                        # optional, each one optional; absent = unlimited
        requests_per_minute: 600
        concurrent_requests: 4
        audio_seconds_per_minute: 3600
        tokens_per_minute: 20000

`lora-openai --api-key KEY` (vLLM's flag) is one key named "api-key" with every model, admin
and no limits. The file holds digests only, so it can be read by whoever deploys the front
without handing out keys. Keys are compared as SHA-256 digests with hmac.compare_digest against
every entry, so neither the time nor the logs tell anything about a key.
"""

import hashlib
import hmac
import logging
import os
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("lora_openai")
LIMIT_NAMES = (
    "requests_per_minute",
    "concurrent_requests",
    "audio_seconds_per_minute",
    "tokens_per_minute",
)
_ENTRY_KEYS = {"name", "sha256", "models", "admin", "limits"}


class KeysFileError(ValueError):
    """The keys file cannot be used; the message lists every problem."""


@dataclass(frozen=True)
class KeyLimits:
    """Per-key limits; None: unlimited."""

    requests_per_minute: int | None = None
    concurrent_requests: int | None = None
    audio_seconds_per_minute: int | None = None
    tokens_per_minute: int | None = None


@dataclass(frozen=True)
class Scope:
    """The model ids a caller may see and use, as glob patterns."""

    patterns: tuple[str, ...]

    def allows(self, model_id: str) -> bool:
        return any(fnmatchcase(model_id, pattern) for pattern in self.patterns)


EVERYTHING = Scope(("*",))


@dataclass(frozen=True)
class KeyEntry:
    name: str
    sha256: bytes  # the key's digest (32 bytes)
    scope: Scope
    admin: bool = False
    limits: KeyLimits = field(default_factory=KeyLimits)


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class KeyRing:
    """The configured keys; `find(key)` is the entry a presented key belongs to, or None."""

    def __init__(self, entries: list[KeyEntry]):
        self.entries = tuple(entries)

    def find(self, key: str) -> KeyEntry | None:
        presented = digest(key)
        found = None
        for entry in self.entries:  # every entry compared: the time does not depend on which
            if hmac.compare_digest(presented, entry.sha256):
                found = entry
        return found


def single_key(key: str) -> KeyRing:
    """`--api-key KEY`: one key, every model, admin, unlimited (vLLM's flag)."""
    return KeyRing([KeyEntry("api-key", digest(key), EVERYTHING, admin=True)])


def parse_keys(raw: Any) -> KeyRing:
    """The parsed file (`{"keys": [...]}`) -> KeyRing; KeysFileError lists every problem."""
    problems: list[str] = []
    items = raw.get("keys") if isinstance(raw, dict) else None
    if not isinstance(items, list):
        raise KeysFileError("the keys file must hold `keys:`, a list of entries")
    if isinstance(raw, dict) and set(raw) - {"keys"}:
        problems.append(f"unknown top-level keys: {sorted(set(raw) - {'keys'})}")
    entries, names, digests = [], set(), set()
    for index, item in enumerate(items):
        where = f"keys[{index}]"
        entry = _entry(item, where, problems)
        if entry is None:
            continue
        if entry.name in names:
            problems.append(f"{where}: name '{entry.name}' is used twice")
        if entry.sha256 in digests:
            problems.append(f"{where} ('{entry.name}'): the same sha256 as an earlier entry")
        names.add(entry.name)
        digests.add(entry.sha256)
        entries.append(entry)
    if problems:
        raise KeysFileError("; ".join(problems))
    return KeyRing(entries)


def _entry(item: Any, where: str, problems: list[str]) -> KeyEntry | None:
    if not isinstance(item, dict):
        problems.append(f"{where} must be a mapping")
        return None
    before = len(problems)
    unknown = sorted(set(item) - _ENTRY_KEYS)
    if unknown:
        problems.append(f"{where}: unknown keys {unknown} (allowed: {sorted(_ENTRY_KEYS)})")
    name = item.get("name")
    if not isinstance(name, str) or not name or not name.isprintable() or len(name) > 64:
        problems.append(f"{where}: name must be a short printable string")
    else:
        where = f"{where} ('{name}')"
    sha = item.get("sha256")
    try:
        sha256 = bytes.fromhex(sha) if isinstance(sha, str) else b""
    except ValueError:
        sha256 = b""
    if len(sha256) != 32:
        problems.append(f"{where}: sha256 must be 64 hex digits (the key's SHA-256)")
    models = item.get("models")
    if (
        not isinstance(models, list)
        or not models
        or not all(isinstance(m, str) and m for m in models)
    ):
        problems.append(f"{where}: models must be a non-empty list of model id patterns")
    admin = item.get("admin", False)
    if not isinstance(admin, bool):
        problems.append(f"{where}: admin must be true or false")
    limits = _limits(item.get("limits", {}), where, problems)
    if len(problems) > before:
        return None
    return KeyEntry(name, sha256, Scope(tuple(models)), admin=admin, limits=limits)


def _limits(raw: Any, where: str, problems: list[str]) -> KeyLimits:
    if not isinstance(raw, dict):
        problems.append(f"{where}: limits must be a mapping")
        return KeyLimits()
    values = {}
    for key, value in raw.items():
        if key not in LIMIT_NAMES:
            problems.append(f"{where}: unknown limit '{key}' (allowed: {', '.join(LIMIT_NAMES)})")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{where}: limits.{key} must be an integer >= 1, got {value!r}")
        else:
            values[key] = value
    return KeyLimits(**values)


def load_keys_file(path: Path) -> KeyRing:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise KeysFileError(f"{path}: {err}") from None
    try:
        return parse_keys(raw)
    except KeysFileError as err:
        raise KeysFileError(f"{path}: {err}") from None


class KeysFile:
    """A keys file re-read when it changes (its mtime, size or inode), checked at most every
    `check_every_s`. A file that turns bad keeps the last good keys (and logs why)."""

    def __init__(self, path: Path, *, check_every_s: float = 1.0, clock=None):
        import time

        self.path = Path(path)
        self.check_every_s = check_every_s
        self._clock = clock or time.monotonic
        self._stamp = self._stat()
        self.ring = load_keys_file(self.path)  # a bad file at start stops the front
        self._checked_at = self._clock()

    def _stat(self) -> tuple | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return (info.st_mtime_ns, info.st_size, info.st_ino)

    def current(self) -> KeyRing:
        now = self._clock()
        if now - self._checked_at >= self.check_every_s:
            self._checked_at = now
            stamp = self._stat()
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self.ring = load_keys_file(self.path)
                    log.info("keys file %s re-read: %d keys", self.path, len(self.ring.entries))
                except KeysFileError as err:
                    log.error("keys file changed but cannot be used (old keys kept): %s", err)
        return self.ring
