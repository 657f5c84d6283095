"""Command-line and Python client for whisper_lora and qwen_vl_lora (tritonclient, gRPC or HTTP)."""
