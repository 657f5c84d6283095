"""A window shorter than 30 s reaches Whisper padded as openai-whisper's `transcribe()` pads it.

Whisper hears 30 s of log-mel frames. openai-whisper's `transcribe()`, faster-whisper and
transformers' long-form generation compute the frames of the audio there is and fill the rest of
the window with zeros (`pad_or_trim` on the features). vLLM 0.32 feeds the audio through
transformers' feature extractor padded with 30 s of silence instead (transformers' short-form
way), which fills the rest with the log-mel floor, a different input: on short espeak-ng
sentences whisper-base then mishears more words (it hears "The train to the city" as "The train
took a city" fed the floor, rightly fed zeros). The frames of the audio itself are the same both
ways (same normalisation: the maximum is the speech's); this fix sets the frames after the
audio's end, len(samples) // hop_length on, to zero, as openai-whisper does.

The merged-weights reference (tests/reference/whisper.py) builds its window as openai-whisper's
`transcribe()` does, independently; tests/unit/test_reference_features.py shows both windows are
equal, so served tokens still equal transformers' `generate()` on the same input features.
"""

import importlib

WHISPER_MODULE = "vllm.model_executor.models.whisper"
PROCESSOR_CLASS = "WhisperMultiModalProcessor"
HOP_LENGTH = 160  # samples per log-mel frame (WhisperFeatureExtractor.hop_length)
_ORIGINAL: dict = {}


def zero_after_audio(features, lengths: list[int], hop_length: int = HOP_LENGTH):
    """Set each row's frames from the end of its audio on to zero (in place); returns features."""
    for row, length in enumerate(lengths):
        features[row, :, length // hop_length :] = 0
    return features


def padded_features(extractor, samples):
    """transformers' feature extractor on one 16 kHz window, padded as served (a [1, 80, 3000]
    tensor): for references, fine-tuning and tests."""
    features = extractor(samples, sampling_rate=16_000, return_tensors="pt").input_features
    return zero_after_audio(features, [len(samples)], getattr(extractor, "hop_length", HOP_LENGTH))


def _audio_lengths(hf_data) -> list[int] | None:
    for key in ("audio", "audios"):
        audios = hf_data.get(key)
        if audios is not None:
            return [len(samples) for samples in audios]
    return None


def _call_hf_processor(self, hf_data, hf_kwargs):
    processed = _ORIGINAL["_call_hf_processor"](self, hf_data, hf_kwargs)
    lengths = _audio_lengths(hf_data)
    features = processed.get("input_features")
    if lengths is None or features is None:
        return processed
    hop_length = getattr(self.info.get_feature_extractor(), "hop_length", HOP_LENGTH)
    zero_after_audio(features, lengths, hop_length)
    return processed


def apply() -> bool:
    """True if the padding was changed now, False if it already was."""
    processor = getattr(importlib.import_module(WHISPER_MODULE), PROCESSOR_CLASS, None)
    if processor is None or not hasattr(processor, "_call_hf_processor"):
        raise RuntimeError(
            f"lora_serving cannot pad Whisper's features as openai-whisper: {WHISPER_MODULE}."
            f"{PROCESSOR_CLASS}._call_hf_processor is missing in this vLLM"
        )
    if processor.__dict__.get("_call_hf_processor") is _call_hf_processor:
        return False
    _ORIGINAL["_call_hf_processor"] = processor._call_hf_processor
    processor._call_hf_processor = _call_hf_processor
    return True
