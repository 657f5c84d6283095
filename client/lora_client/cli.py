"""lora-client: talk to whisper_lora and qwen_vl_lora from the shell.

lora-client transcribe speech.wav [--adapter alpha] [--language de] [--task translate] [--stream]
lora-client describe photo.png --prompt "What is shown?" [--adapter alpha] [--stream]
"""

import argparse
import sys
from pathlib import Path

from lora_client.requests import TritonModelClient, transcription_inputs, vision_inputs


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--adapter", help="LoRA adapter name (default: the base model)")
    parser.add_argument("--stream", action="store_true", help="print text as it is decoded")
    parser.add_argument(
        "--url", default=None, help="host:port (default 127.0.0.1:8001 gRPC, 127.0.0.1:8000 HTTP)"
    )
    parser.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--model", default=None, help="Triton model name")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lora-client", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    transcribe = commands.add_parser("transcribe", help="speech file(s) -> text (whisper_lora)")
    transcribe.add_argument("files", nargs="+", type=Path)
    transcribe.add_argument("--language", help="ISO 639-1 code; default: detect")
    transcribe.add_argument("--task", choices=["transcribe", "translate"], default=None)
    _common(transcribe)
    describe = commands.add_parser("describe", help="image(s) + prompt -> text (qwen_vl_lora)")
    describe.add_argument("images", nargs="+", type=Path)
    describe.add_argument("--prompt", required=True)
    _common(describe)
    args = parser.parse_args(argv)

    url = args.url or ("127.0.0.1:8001" if args.protocol == "grpc" else "127.0.0.1:8000")
    if args.stream and args.protocol == "http":
        parser.error("--stream needs --protocol grpc")
    client = TritonModelClient(url, args.protocol)
    try:
        if args.command == "transcribe":
            for path in args.files:
                inputs = transcription_inputs(
                    client.module,
                    path,
                    language=args.language,
                    task=args.task,
                    stream=args.stream,
                    max_tokens=args.max_tokens,
                )
                if len(args.files) > 1:
                    print(f"{path}: ", end="")
                _run(
                    client, args.model or "whisper_lora", inputs, ("text_output", "language"), args
                )
        else:
            images = [path.read_bytes() for path in args.images]
            inputs = vision_inputs(
                client.module, args.prompt, images, stream=args.stream, max_tokens=args.max_tokens
            )
            _run(
                client,
                args.model or "qwen_vl_lora",
                inputs,
                ("text_output",),
                args,
                final_is_full_text=False,
            )
    except Exception as err:  # a CLI reports, it does not dump a traceback
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def _run(client, model, inputs, names, args, *, final_is_full_text: bool) -> None:
    """Print replies; streamed ones carry deltas (whisper_lora's last one: the whole text)."""
    for reply in client.infer(model, inputs, output_names=names, adapter=args.adapter):
        text = reply.outputs.get("text_output", [""])[0]
        if not args.stream:
            print(text)
        elif not reply.final:
            print(text, end="", flush=True)
        else:
            print("" if final_is_full_text else text)


if __name__ == "__main__":
    sys.exit(main())
