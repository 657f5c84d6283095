"""A Triton request's inputs as plain numpy arrays, with typed, validated accessors.

Triton gives every input a leading batch dimension (max_batch_size > 0). A request carrying N rows
is N items; these helpers return one value per row and name the input in every error.
"""

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lora_serving.errors import InvalidRequest


@dataclass
class RawRequest:
    tensors: dict[str, np.ndarray]
    parameters: dict[str, Any] = field(default_factory=dict)
    request_id: str = ""

    @property
    def batch_size(self) -> int:
        sizes = {name: arr.shape[0] for name, arr in self.tensors.items() if arr.ndim > 0}
        if not sizes:
            raise InvalidRequest("request has no inputs")
        if len(set(sizes.values())) > 1:
            raise InvalidRequest(f"inputs disagree on the batch dimension: {sizes}")
        return next(iter(sizes.values()))

    def has(self, name: str) -> bool:
        return name in self.tensors

    def strings(self, name: str, row: int) -> list[str]:
        """All elements of a TYPE_STRING input's row, decoded as UTF-8."""
        return [_decode(name, item) for item in self._row(name, row).reshape(-1)]

    def raw_bytes(self, name: str, row: int) -> list[bytes]:
        return [
            bytes(item) if not isinstance(item, str) else item.encode()
            for item in self._row(name, row).reshape(-1)
        ]

    def string(self, name: str, row: int, default: str | None = None) -> str | None:
        if name not in self.tensors:
            return default
        values = self.strings(name, row)
        if len(values) != 1:
            raise InvalidRequest(f"input '{name}' must hold exactly one string, got {len(values)}")
        return values[0]

    def boolean(self, name: str, row: int, default: bool) -> bool:
        if name not in self.tensors:
            return default
        value = self._scalar(name, row)
        if not isinstance(value, (bool, np.bool_)):
            raise InvalidRequest(
                f"input '{name}' must be TYPE_BOOL, got {self.tensors[name].dtype}"
            )
        return bool(value)

    def integer(self, name: str, row: int, default: int | None) -> int | None:
        if name not in self.tensors:
            return default
        value = self._scalar(name, row)
        if not np.issubdtype(type(value), np.integer):
            raise InvalidRequest(
                f"input '{name}' must be an integer, got {self.tensors[name].dtype}"
            )
        return int(value)

    def number(self, name: str, row: int, default: float | None) -> float | None:
        if name not in self.tensors:
            return default
        value = self._scalar(name, row)
        if not np.issubdtype(type(value), np.number) or isinstance(value, np.bool_):
            raise InvalidRequest(f"input '{name}' must be a number, got {self.tensors[name].dtype}")
        if not np.isfinite(value):
            raise InvalidRequest(f"input '{name}' must be finite, got {value}")
        return float(value)

    def array(self, name: str, row: int) -> np.ndarray:
        return self._row(name, row)

    def _row(self, name: str, row: int) -> np.ndarray:
        try:
            return self.tensors[name][row]
        except KeyError:
            raise InvalidRequest(f"input '{name}' is missing") from None
        except IndexError:
            raise InvalidRequest(f"input '{name}' has no row {row}") from None

    def _scalar(self, name: str, row: int):
        values = self._row(name, row).reshape(-1)
        if values.size != 1:
            raise InvalidRequest(f"input '{name}' must hold exactly one value, got {values.size}")
        return values[0]


def _decode(name: str, item: Any) -> str:
    if isinstance(item, str):
        return item
    try:
        return bytes(item).decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidRequest(f"input '{name}' is not valid UTF-8 (byte {err.start})") from None
