"""Where adapters come from: one small interface (AdapterSource), several sources.

A source offers, on each `scan`, candidates (a name, where it is, and a fingerprint that
changes whenever what would be served changes) and refusals (names it holds but cannot offer,
with the reason); `materialise` writes one candidate's files into a private snapshot folder.
Sources, in order of precedence for a name:
  multi_lora.json   Triton vllm_backend's {"name": "folder"}, written by the operator with the
                    model repository; its folders may lie anywhere (like model.json's `model`).
                    (adapters.folders.MultiLoraFile)
  adapter roots     each subfolder of a folder root is an adapter named after it
                    (adapters.folders.FolderRoot); each immediate "subfolder" of an
                    s3://bucket/prefix/ root likewise (adapters.object_store.S3Root).
  control requests  `load name path` names a folder or prefix inside a root (`locate`).

The engine never reads an operator's folder or bucket: each loaded version is copied into a
private snapshot first and checked there (adapters.snapshots), so what was checked is exactly
what is served, and files replaced or deleted later cannot change or break a version the
engine may still load.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from lora_serving.adapters.catalog import check_adapter_name
from lora_serving.adapters.snapshots import Snapshots
from lora_serving.errors import InvalidRequest

__all__ = [
    "CONTROL",
    "MULTI_LORA",
    "ROOT",
    "AdapterSource",
    "AdapterSources",
    "Candidate",
    "Refusal",
    "Snapshots",
    "SourceScan",
    "SourceUnavailable",
]

MULTI_LORA = "multi_lora.json"
ROOT = "root"
CONTROL = "control"


class SourceUnavailable(Exception):
    """A source cannot be read just now (store down or slow, an object changed while it was
    downloaded): tried again at the next rescan, never remembered as a refusal."""


@dataclass(frozen=True)
class Candidate:
    """An adapter a source offers; `fingerprint` changes whenever one of its files does."""

    name: str
    origin: Path | str  # where it is: a resolved folder, or an s3://bucket/prefix/name/ URL
    source: str  # multi_lora.json | root | control
    fingerprint: tuple
    root: Path | str | None = None  # the configured root that confines it; None: multi_lora.json
    provider: "AdapterSource | None" = field(default=None, compare=False, repr=False)

    @property
    def source_key(self) -> str:
        """The key SourceScan.unreadable uses for the source it came from."""
        return str(self.root) if self.root is not None else self.source


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


class AdapterSource(Protocol):
    """One place adapters come from (called from worker threads, one scan at a time)."""

    key: str  # names it in SourceScan.unreadable and the listing: "multi_lora.json", a root

    def scan(self) -> SourceScan:
        """What it offers now; an unreadable source says so in `unreadable`, never raises."""
        ...

    def materialise(self, candidate: Candidate, folder: Path) -> None:
        """Write the candidate's adapter_config.json and safetensors weights into `folder`
        (empty, private). ConfigError: refused; SourceUnavailable: try again later."""
        ...


class AdapterRoot(AdapterSource, Protocol):
    """A root: it also resolves a control request's path, and describes itself."""

    def join(self, relative: str) -> str:
        """`relative` (a control request's path) inside this root."""
        ...

    def locate(self, name: str, path: str) -> Candidate | None:
        """The adapter at `path` (absolute, or a URL) as `name`; None if outside this root;
        InvalidRequest if inside but unusable."""
        ...

    def describe(self) -> dict: ...


class AdapterSources:
    """Every source of one model, in precedence order; a name offered twice is refused the
    second time."""

    def __init__(
        self,
        multi_lora: Path | None,
        roots: tuple[Path | str, ...],
        *,
        max_adapter_bytes: int = 2 * 1024**3,
        max_adapter_objects: int = 64,
    ):
        # Imported here: the sources' modules import this one's types.
        from lora_serving.adapters.folders import FolderRoot, MultiLoraFile
        from lora_serving.adapters.object_store import S3Root, is_s3_url

        self.multi_lora = multi_lora
        self.roots = tuple(root if is_s3_url(root) else Path(root) for root in roots)
        self._multi_lora = MultiLoraFile(multi_lora) if multi_lora is not None else None
        self._roots: list[AdapterRoot] = [
            S3Root(root, max_adapter_bytes=max_adapter_bytes, max_objects=max_adapter_objects)
            if isinstance(root, str)
            else FolderRoot(root)
            for root in self.roots
        ]

    @classmethod
    def from_settings(cls, settings) -> "AdapterSources":
        """model.json's sources (none with LoRA off); roots_env is read now."""
        if not settings.lora_enabled:
            return cls(None, ())
        options = settings.serving.adapters
        return cls(
            settings.multi_lora_path,
            options.all_roots(model_dir=settings.model_dir),
            max_adapter_bytes=options.max_adapter_bytes,
            max_adapter_objects=options.max_adapter_objects,
        )

    def scan(self) -> SourceScan:
        """Every source's adapters now."""
        scan = SourceScan()
        sources: list[AdapterSource] = list(self._roots)
        if self._multi_lora is not None and self._multi_lora.path.exists():
            sources.insert(0, self._multi_lora)
        for source in sources:
            try:
                found = source.scan()
            except Exception as err:  # a defect in one source must not stop the others
                found = SourceScan(unreadable={source.key: f"{source.key}: scan failed: {err!r}"})
            scan.unreadable.update(found.unreadable)
            for name, refusal in found.refused.items():
                scan.refused.setdefault(name, refusal)
            for candidate in found.candidates.values():
                self._offer(scan, candidate)
        return scan

    @staticmethod
    def _offer(scan: SourceScan, candidate: Candidate) -> None:
        taken = scan.candidates.get(candidate.name)
        if taken is None:
            scan.candidates[candidate.name] = candidate
            return
        where = f"root {candidate.root}" if candidate.root is not None else str(candidate.origin)
        message = (
            f"adapter '{candidate.name}' in {where} is also provided by {_describe(taken)}; "
            "the first one is served"
        )
        scan.refused.setdefault(candidate.name, Refusal(candidate.source, message))

    def locate(self, name: str, path: str) -> Candidate:
        """An adapter named by a control request: a folder (absolute, or relative to the first
        root) or an s3:// URL; it must lie inside a root."""
        check_adapter_name(name)
        if not self._roots:
            raise InvalidRequest(
                "no adapter roots are configured (serving.adapters.roots in model.json); "
                "runtime loads are limited to folders inside them"
            )
        if "://" not in path and not Path(path).is_absolute():
            path = self._roots[0].join(path)
        for root in self._roots:
            candidate = root.locate(name, path)
            if candidate is not None:
                return candidate
        roots = ", ".join(str(root) for root in self.roots)
        shown = path if "://" in path else f"folder {path} resolves to {Path(path).resolve()},"
        raise InvalidRequest(f"adapter {shown} outside the adapter roots ({roots})")

    def describe_roots(self) -> list[dict]:
        return [root.describe() for root in self._roots]


def _describe(candidate: Candidate) -> str:
    if candidate.source == ROOT:
        return f"root {candidate.root}"
    return candidate.source
