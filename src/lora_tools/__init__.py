"""Tooling beside the runtime package: benchmarks, soak, demo model builders, fine-tuning.

Nothing here is loaded by tritonserver or lora-openai; lora_serving never imports it.
"""
