"""Serving core for many LoRA fine-tunes of Whisper and Qwen-VL behind Triton.

Only `lora_serving.triton` imports Triton's Python backend; everything else runs without it.
"""
