"""A turn's audio -> its text through the file-upload path: the turn as a WAV file in a
SpeechRequest, to whisper_lora through the gateway, as /v1/audio/transcriptions sends it (so a
completed turn equals the file transcription of its audio). Cancelling the awaiting task
cancels the Triton request."""

import io
import wave

from lora_openai.audio import SpeechRequest
from lora_openai.auth import Caller
from lora_openai.errors import OpenAIError
from lora_openai.front import Front
from lora_openai.models import ModelId
from lora_openai.realtime.events import ProtocolError, SessionConfig
from lora_openai.streaming import scoped


def wav_file(pcm: bytes, rate: int) -> bytes:
    """PCM16 mono samples -> a WAV file of them."""
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(pcm)
    return out.getvalue()


def as_protocol_error(err: OpenAIError) -> ProtocolError:
    error = err.body()["error"]
    return ProtocolError(err.message, error["code"], error["param"], error_type=error["type"])


async def transcribe(
    front: Front,
    caller: Caller,
    model: ModelId,
    pcm: bytes,
    rate: int,
    config: SessionConfig,
    final: bool,
    *,
    prefix: str | None = None,
) -> str:
    """The text of `pcm`; a final (billed) decode counts the audio as a file upload does. With
    `prefix`, the decode continues from that text and gives what follows it."""
    request = SpeechRequest(
        task="transcribe",
        model=model.id,
        audio=wav_file(pcm, rate),
        language=config.transcription.language,
        prompt=config.transcription.prompt,
        decoding={"prefix": prefix} if prefix else {},
    )
    seconds = len(pcm) / 2 / rate
    try:
        if final:
            if caller.key is not None:
                front.tenancy.limits.audio(caller.key, seconds)
            front.tenancy.usage.audio(caller.name, model.id, seconds)
        replies = scoped(
            front.gateway.stream(model.triton_model, request.triton_fields(), model.parameters),
            front.catalog,
            model,
            caller,
        )
        outputs: dict = {}
        async for reply in replies:
            outputs.update(reply.outputs)
    except OpenAIError as err:  # a tenant limit (429) included
        raise as_protocol_error(err) from None
    return outputs.get("text_output", "")
