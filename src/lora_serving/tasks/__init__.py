"""Request decoding per model kind: RawRequest -> RequestPlan, chunks -> named outputs."""

from pathlib import Path


def task_class(name: str):
    """The task implementation a model.py names ("transcription" or "vision_chat")."""
    if name == "transcription":
        from lora_serving.tasks.transcription import TranscriptionTask

        return TranscriptionTask
    if name == "vision_chat":
        from lora_serving.tasks.vision_chat import VisionChatTask

        return VisionChatTask
    raise ValueError(f"unknown task '{name}'; use 'transcription' or 'vision_chat'")


def load_tokenizer(model: str):
    """The model folder's tokenizer, with the processor's chat template if only it has one."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    if not getattr(tokenizer, "chat_template", None):
        for candidate in ("chat_template.jinja", "chat_template.json"):
            path = Path(model) / candidate
            if path.is_file():
                text = path.read_text()
                if candidate.endswith(".json"):
                    import json

                    text = json.loads(text)["chat_template"]
                tokenizer.chat_template = text
                break
    return tokenizer
