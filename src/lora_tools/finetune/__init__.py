"""Fine-tune a Whisper LoRA adapter on a domain the base model gets wrong, and measure the gain.

corpus.py    invented drug names in sentence templates, a deterministic train / held-out split,
             espeak-ng speech with several voices and speeds
train.py     PEFT LoRA training of whisper-base on that speech (decoder only, or every layer)
evaluate.py  held-out speech through the running tritonserver: WER and domain-term recall per
             adapter, and the base model's output on ordinary speech
metrics.py   word error rate and term recall after Whisper's English normaliser
`python -m lora_tools.finetune train|evaluate ...` (see __main__.py).
"""
