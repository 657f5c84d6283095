"""The same request through the OpenAI-compatible front (lora-openai), as a curl command or as
openai SDK code: what `lora-client transcribe|describe ... --show curl|openai` prints."""

import json
import mimetypes
import shlex
from pathlib import Path

DEFAULT_BASE_URL = "http://127.0.0.1:9000/v1"


def model_id(model: str, adapter: str | None) -> str:
    """The OpenAI `model` field: `<triton model>` or `<triton model>/<adapter>`."""
    return f"{model}/{adapter}" if adapter else model


def speech_request(
    file: Path,
    model: str,
    *,
    task: str | None = None,
    language: str | None = None,
    prompt: str | None = None,
    timestamps: bool = False,
    word_timestamps: bool = False,
    stream: bool = False,
    decoding: dict | None = None,
) -> tuple[str, dict, dict]:
    """(endpoint, OpenAI fields, whisper_lora decoding options as extra form fields)."""
    endpoint = "translations" if task == "translate" else "transcriptions"
    fields: dict = {"model": model}
    if language:
        fields["language"] = language
    if prompt:
        fields["prompt"] = prompt
    if timestamps or word_timestamps:
        fields["response_format"] = "verbose_json"
        fields["timestamp_granularities"] = ["segment"] + (["word"] if word_timestamps else [])
    if stream:
        fields["stream"] = True
    return endpoint, fields, dict(decoding or {})


def _form_value(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return value if isinstance(value, str) else json.dumps(value)


def speech_curl(base_url: str, file: Path, endpoint: str, fields: dict, extra: dict) -> str:
    parts = ["curl", "-s", f"{base_url}/audio/{endpoint}", "-F", f"file=@{file}"]
    for name, value in {**fields, **extra}.items():
        if name == "timestamp_granularities":
            for granularity in value:
                parts += ["-F", f"timestamp_granularities[]={granularity}"]
        else:
            parts += ["-F", f"{name}={_form_value(value)}"]
    return shlex.join(parts)


def speech_python(base_url: str, file: Path, endpoint: str, fields: dict, extra: dict) -> str:
    args = "".join(f", {name}={value!r}" for name, value in fields.items())
    if extra:
        args += f", extra_body={extra!r}"
    show = "for event in result:\n    print(event)" if fields.get("stream") else "print(result)"
    return (
        "from openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{base_url}", api_key="unused")\n'
        f"with open({str(file)!r}, 'rb') as audio:\n"
        f"    result = client.audio.{endpoint}.create(file=audio{args})\n"
        f"{show}\n"
    )


def chat_messages(prompt: str, images: list[Path], system_prompt: str | None) -> list[dict]:
    """Messages with `{{IMAGE n}}` where the data URL of image n goes."""
    content = [
        {"type": "image_url", "image_url": {"url": f"{{{{IMAGE {index}}}}}"}}
        for index in range(len(images))
    ]
    content.append({"type": "text", "text": prompt})
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*messages, {"role": "user", "content": content}]


def _mime(path: Path) -> str:
    return mimetypes.guess_type(path.name)[0] or "image/png"


def chat_curl(base_url: str, body: dict, images: list[Path]) -> str:
    escaped = json.dumps(body)
    for special in ("\\", '"', "$", "`"):  # inside the shell's double quotes
        escaped = escaped.replace(special, "\\" + special)
    for index, path in enumerate(images):  # the one substitution the shell should run
        url = f"data:{_mime(path)};base64,$(base64 -w0 {shlex.quote(str(path))})"
        escaped = escaped.replace(f"{{{{IMAGE {index}}}}}", url)
    return (
        f"curl -s {base_url}/chat/completions -H 'Content-Type: application/json' -d \"{escaped}\""
    )


def chat_python(base_url: str, body: dict, images: list[Path]) -> str:
    body = dict(body)
    stream = body.pop("stream", False)
    lines = [
        "import base64",
        "from openai import OpenAI",
        "",
        f'client = OpenAI(base_url="{base_url}", api_key="unused")',
    ]
    for index, path in enumerate(images):
        lines.append(
            f"image{index} = 'data:{_mime(path)};base64,' + "
            f"base64.b64encode(open({str(path)!r}, 'rb').read()).decode()"
        )
    text = repr(body)
    for index in range(len(images)):
        text = text.replace(f"'{{{{IMAGE {index}}}}}'", f"image{index}")
    if stream:
        lines += [
            f"for chunk in client.chat.completions.create(stream=True, **{text}):",
            '    print(chunk.choices[0].delta.content or "", end="", flush=True)',
            "print()",
        ]
    else:
        lines += [
            f"answer = client.chat.completions.create(**{text})",
            "print(answer.choices[0].message.content)",
        ]
    return "\n".join(lines) + "\n"
