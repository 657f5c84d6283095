"""lora-client: talk to whisper_lora and qwen_vl_lora from the shell.

lora-client transcribe speech.wav [--adapter alpha] [--language de] [--task translate] [--stream]
                      [--timestamps] [--prompt "previous text"]
lora-client describe photo.png --prompt "What is shown?" [--adapter alpha] [--stream]
lora-client describe --video f0.png f1.png f2.png --video-fps 2 --prompt "What happens?"
"""

import argparse
import json
import sys
from pathlib import Path

from lora_client.requests import RequestError, send, transcription_fields, vision_fields

DEFAULT_URL = {"grpc": "127.0.0.1:8001", "http": "127.0.0.1:8000"}


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--adapter", help="LoRA adapter name (default: the base model)")
    parser.add_argument("--stream", action="store_true", help="print text as it is decoded")
    parser.add_argument("--url", help="host:port (default 127.0.0.1:8001 for gRPC, :8000 HTTP)")
    parser.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--model", help="Triton model name")


def _print_replies(replies, *, stream: bool, final_is_full_text: bool):
    """Streamed replies carry deltas; whisper_lora's final one carries the whole text.

    Returns the final reply.
    """
    reply = None
    for reply in replies:
        text = reply.outputs.get("text_output", [""])[0]
        if not stream:
            print(text)
        elif not reply.final:
            print(text, end="", flush=True)
        else:
            print("" if final_is_full_text else text)
    return reply


def _print_segments(reply) -> None:
    """whisper_lora's `segments` output (JSON): one line per segment, times in seconds."""
    for segment in json.loads(reply.outputs.get("segments", ["[]"])[0] or "[]"):
        print(f"[{segment['start']:8.2f} -> {segment['end']:8.2f}] {segment['text']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lora-client", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    transcribe = commands.add_parser("transcribe", help="speech file(s) -> text (whisper_lora)")
    transcribe.add_argument("files", nargs="+", type=Path)
    transcribe.add_argument("--language", help="ISO 639-1 code; default: detect")
    transcribe.add_argument("--task", choices=["transcribe", "translate"])
    transcribe.add_argument("--timestamps", action="store_true", help="also print segments")
    transcribe.add_argument("--prompt", help="previous text (context for the first words)")
    _common(transcribe)
    describe = commands.add_parser(
        "describe", help="image(s) and/or a video + prompt -> text (qwen_vl_lora)"
    )
    describe.add_argument("images", nargs="*", type=Path, help="PNG, JPEG or WebP files")
    describe.add_argument("--prompt", required=True)
    describe.add_argument(
        "--video", nargs="+", type=Path, metavar="FRAME", help="one video: its frames, in order"
    )
    describe.add_argument("--video-fps", type=float, help="frames per second of --video")
    describe.add_argument("--system-prompt")
    _common(describe)
    args = parser.parse_args(argv)
    url = args.url or DEFAULT_URL[args.protocol]

    try:
        if args.command == "transcribe":
            for path in args.files:
                fields = transcription_fields(
                    path,
                    language=args.language,
                    task=args.task,
                    prompt=args.prompt,
                    timestamps=args.timestamps,
                    stream=args.stream,
                    max_tokens=args.max_tokens,
                )
                if len(args.files) > 1:
                    print(f"{path}: ", end="")
                replies = send(
                    url, args.protocol, args.model or "whisper_lora", fields, adapter=args.adapter
                )
                final = _print_replies(replies, stream=args.stream, final_is_full_text=True)
                if args.timestamps:
                    _print_segments(final)
        else:
            fields = vision_fields(
                args.prompt,
                [path.read_bytes() for path in args.images],
                video=[path.read_bytes() for path in args.video or []],
                video_fps=args.video_fps,
                system_prompt=args.system_prompt,
                stream=args.stream,
                max_tokens=args.max_tokens,
            )
            replies = send(
                url, args.protocol, args.model or "qwen_vl_lora", fields, adapter=args.adapter
            )
            _print_replies(replies, stream=args.stream, final_is_full_text=False)
    except (RequestError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
