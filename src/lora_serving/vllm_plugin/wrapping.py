"""Wrapping a vLLM method once per process, when several of our fixes wrap the same one."""

from collections.abc import Callable
from typing import Any


def wrap_method(cls: type, name: str, wrapper: Callable, originals: dict[str, Any]) -> bool:
    """Make `wrapper` the class's `name`, its previous function kept in `originals[name]` (and as
    `wrapper.__wrapped__`); False if `wrapper` is already in the chain of wrappers there."""
    current = cls.__dict__.get(name)
    if current is None:
        raise RuntimeError(f"{cls.__qualname__}.{name} is missing: re-check lora_serving's fix")
    function = current
    while function is not None:
        if function is wrapper:
            return False
        function = getattr(function, "__wrapped__", None)
    originals[name] = current
    wrapper.__wrapped__ = current
    setattr(cls, name, wrapper)
    return True


def replace_methods(
    cls: type, patches: dict[str, tuple[str, Callable]], originals: dict[str, Any]
) -> bool:
    """Set each `name` of the class to its patch (`patches[name] = (key, patch)`), the function
    it replaces kept in `originals[key]`; True if any was not already patched. The class's
    methods are looked up per object afterwards, so objects made later take the patches."""
    changed = False
    for name, (key, patch) in patches.items():
        if getattr(cls, name) is not patch:
            originals[key] = getattr(cls, name)
            setattr(cls, name, patch)
            changed = True
    return changed
