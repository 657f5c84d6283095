"""Sizes and byte budgets of the Whisper memos (encoder outputs, cross-attention K/V)."""

import os


def tensor_bytes(tensor) -> int:
    return int(tensor.numel() * tensor.element_size())


def budget_from_env(variable: str, default_mb: float) -> int:
    """Bytes from a variable in MiB (unset or empty: `default_mb`; 0 turns the memo off)."""
    value = os.environ.get(variable, "").strip()
    megabytes = float(value) if value else default_mb
    return max(0, int(megabytes * 2**20))
