"""Whisper's decoder prompt reaches the model exactly as given.

vLLM 0.32 puts the decoder start token <|startoftranscript|> in front of every encoder-decoder
decoder prompt that does not start with it (transformers' generic generate() convention). Whisper
prompts with previous text start with <|startofprev|> and carry <|startoftranscript|> after that
text, as openai-whisper and transformers' `generate(prompt_ids=...)` send them; vLLM made that
`<|startoftranscript|><|startofprev|> ... <|startoftranscript|>...`, a form Whisper was never
trained on (upstream issue 53206), which weakened previous text. vLLM already has the switch for
processors whose prompts are complete (`EncDecMultiModalProcessor.skip_decoder_start_token`, set
by its Cohere ASR model); this fix sets it for Whisper. Prompts must then start with
<|startoftranscript|> or <|startofprev|> themselves: lora_serving's always do.
"""

import importlib

WHISPER_MODULE = "vllm.model_executor.models.whisper"
PROCESSOR_CLASS = "WhisperMultiModalProcessor"
SWITCH = "skip_decoder_start_token"


def apply() -> bool:
    """True if the switch was turned on now, False if it already was; RuntimeError if this vLLM
    has no such switch (the code to patch has changed)."""
    processor = getattr(importlib.import_module(WHISPER_MODULE), PROCESSOR_CLASS, None)
    if processor is None or not isinstance(getattr(processor, SWITCH, None), bool):
        raise RuntimeError(
            f"lora_serving cannot keep Whisper's decoder prompt as given: {WHISPER_MODULE}."
            f"{PROCESSOR_CLASS}.{SWITCH} is missing in this vLLM"
        )
    if getattr(processor, SWITCH):
        return False
    setattr(processor, SWITCH, True)
    return True


def applied() -> bool:
    """Whether prompts reach Whisper unprefixed in this process (the task sizes prompts by it)."""
    processor = getattr(importlib.import_module(WHISPER_MODULE), PROCESSOR_CLASS, None)
    return bool(getattr(processor, SWITCH, False))
