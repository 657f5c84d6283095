def register() -> None:
    """Placeholder: filled in by the plugin work."""
