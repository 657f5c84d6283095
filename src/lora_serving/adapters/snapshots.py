"""Private copies of adapters, one per loaded version, removed when it is dropped.

A version's source writes its files into a hidden temporary folder, which is renamed into
place only once complete: a snapshot folder is either whole or absent, whatever failed while
it was copied or downloaded.
"""

import shutil
import tempfile
from pathlib import Path

from lora_serving.errors import ConfigError


class Snapshots:
    def __init__(self, parent: Path | None, label: str):
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix=f"lora-adapters-{label}-", dir=parent))

    def take(self, candidate, int_id: int) -> Path:
        """The candidate's files, written by its source (candidate.provider), read-only."""
        target = self.folder / f"{candidate.name}@{int_id}"
        partial = self.folder / f".{candidate.name}@{int_id}.partial"
        partial.mkdir()
        try:
            candidate.provider.materialise(candidate, partial)
            for file in partial.iterdir():
                file.chmod(0o444)  # what was checked is not to be edited
            partial.rename(target)
        except OSError as err:
            shutil.rmtree(partial, ignore_errors=True)
            where = f"adapter '{candidate.name}' ({candidate.origin})"
            raise ConfigError(where, [f"cannot copy the adapter: {err}"]) from None
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return target

    def remove(self, snapshot: Path) -> None:
        if snapshot.parent == self.folder:
            shutil.rmtree(snapshot, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
