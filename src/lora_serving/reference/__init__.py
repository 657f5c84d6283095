"""Merged-weights references (Hugging Face transformers + PEFT, float32) for the served models."""
