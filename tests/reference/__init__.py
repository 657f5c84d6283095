"""Merged-weights references (Hugging Face transformers + PEFT, float32) for the served models.

They judge the product, so they import none of it (tests/unit/test_import_boundary.py checks)."""
