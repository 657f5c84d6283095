"""vLLM engine lifecycle and generation (no Triton import)."""
