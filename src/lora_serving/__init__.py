"""Serving core for many LoRA fine-tunes of Whisper and Qwen-VL behind Triton (no Triton import here)."""
