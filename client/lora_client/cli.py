"""lora-client: talk to whisper_lora and qwen_vl_lora from the shell.

lora-client transcribe speech.wav [--adapter alpha] [--language de] [--task translate] [--stream]
                      [--timestamps] [--word-timestamps [--no-word-timestamps-refine]]
                      [--prompt "previous text"] [--hotwords "Zyprexa"]
                      [--prefix "start of the transcript"]
                      [--suppress-tokens "-1,1234"] [--no-suppress-blank] [--vad-filter]
                      [--beam-size 5 [--beam-rule faster-whisper]] [--temperature 0 [0.2 ...]]
                      [--no-condition-on-previous-text]
lora-client describe photo.png --prompt "What is shown?" [--adapter alpha] [--stream]
lora-client describe --video f0.png f1.png f2.png --video-fps 2 --prompt "What happens?"
lora-client list-adapters [--model qwen_vl_lora] [--json]
lora-client transcribe|describe ... --show curl|openai   the same request through the OpenAI API
lora-client adapters rescan|load NAME [PATH]|unload NAME --model qwen_vl_lora
lora-client live speech.wav [--adapter alpha] [--language en] [--openai-url http://...:9000/v1]
                 stream a file to lora-openai's /v1/realtime in real time: deltas, then turns
arecord -q -t raw -f S16_LE -r 24000 -c 1 | lora-client live - [--adapter alpha]
                 the same from a microphone (raw PCM16 mono 24 kHz on standard input)
"""

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from lora_client import openai_examples
from lora_client.requests import (
    RequestError,
    adapter_command,
    send,
    transcription_fields,
    vision_fields,
)

DEFAULT_URL = {"grpc": "127.0.0.1:8001", "http": "127.0.0.1:8000"}
MODELS = ("whisper_lora", "qwen_vl_lora")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--adapter", help="LoRA adapter name (default: the base model)")
    parser.add_argument("--stream", action="store_true", help="print text as it is decoded")
    parser.add_argument("--url", help="host:port (default 127.0.0.1:8001 for gRPC, :8000 HTTP)")
    parser.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--model", help="Triton model name")
    parser.add_argument(
        "--show",
        choices=["curl", "openai"],
        help="print this request for the OpenAI-compatible API (lora-openai) as a curl command "
        "or as openai SDK code, instead of sending it",
    )
    parser.add_argument(
        "--openai-url",
        default=openai_examples.DEFAULT_BASE_URL,
        help=f"base URL for --show (default {openai_examples.DEFAULT_BASE_URL})",
    )


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


def _print_words(reply) -> None:
    """Each segment's `words`: one line per word (start, end, probability, word)."""
    for segment in json.loads(reply.outputs.get("segments", ["[]"])[0] or "[]"):
        for word in segment.get("words", ()):
            start, end, probability = word["start"], word["end"], word["probability"]
            print(f"{start:8.2f} {end:8.2f} {probability:6.3f} {word['word'].strip()}")


def _print_listing(listing: dict) -> None:
    limits = ", ".join(f"{key} {value}" for key, value in listing.get("limits", {}).items())
    print(f"{listing['model']} ({limits})")
    rows = [("NAME", "STATE", "RANK", "VERSION", "SOURCE", "PATH")]
    rows += [
        # without the model's control token the listing has names only
        tuple(
            str(a.get(key, "-")) + (" pinned" if key == "state" and a.get("pinned") else "")
            for key in ("name", "state", "rank", "version", "source", "path")
        )
        for a in listing["adapters"]
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print(
            "  "
            + "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)),
            row[-1],
        )
    for retiring in listing.get("retiring", []):
        print(
            f"  retiring: {retiring['name']} id {retiring['id']} ({retiring['in_flight']} running)"
        )
    for name in listing.get("unloaded", []):
        print(f"  unloaded: {name}")
    for name, message in listing.get("refused", {}).items():
        print(f"  refused: {name}: {message}")


def _adapters(args, url: str) -> None:
    """list-adapters / adapters COMMAND: the model's JSON answer (a table for list)."""
    action = getattr(args, "action", "list")
    if action != "list" and not args.model:
        raise RequestError(f"adapters {action} changes one model: give --model")
    command = shlex.join([action, *args.arguments])
    for model in [args.model] if args.model else MODELS:
        answer = adapter_command(url, args.protocol, model, command)
        if args.json or action != "list":
            print(json.dumps(answer, indent=2))
        else:
            _print_listing(answer)


def _decoding(args) -> dict:
    """Whisper decoding options given on the command line (the server's defaults otherwise)."""
    decoding = {}
    if args.suppress_tokens is not None:
        decoding["suppress_tokens"] = args.suppress_tokens
    if args.no_suppress_blank:
        decoding["suppress_blank"] = False
    if args.vad_filter:
        decoding["vad_filter"] = True
    if args.beam_size is not None:
        decoding["beam_size"] = args.beam_size
    if args.beam_rule is not None:
        decoding["beam_rule"] = args.beam_rule
    if args.temperature is not None:
        values = args.temperature
        decoding["temperature"] = values[0] if len(values) == 1 else values
    if args.no_condition_on_previous_text:
        decoding["condition_on_previous_text"] = False
    if args.hotwords is not None:
        decoding["hotwords"] = args.hotwords
    if args.prefix is not None:
        decoding["prefix"] = args.prefix
    if getattr(args, "word_timestamps", False):
        decoding["word_timestamps"] = True
        if args.no_word_timestamps_refine:
            decoding["word_timestamps_refine"] = False
    return decoding


def _show(args) -> None:
    """transcribe / describe --show: the request as curl or openai SDK code."""
    base = args.openai_url.rstrip("/")
    if args.command == "transcribe":
        model = openai_examples.model_id(args.model or "whisper_lora", args.adapter)
        decoding = _decoding(args)
        if args.max_tokens:
            decoding["max_tokens"] = args.max_tokens
        for path in args.files:
            request = openai_examples.speech_request(
                path,
                model,
                task=args.task,
                language=args.language,
                prompt=args.prompt,
                timestamps=args.timestamps,
                word_timestamps=args.word_timestamps,
                stream=args.stream,
                decoding={k: v for k, v in decoding.items() if k != "word_timestamps"},
            )
            show = (
                openai_examples.speech_curl
                if args.show == "curl"
                else (openai_examples.speech_python)
            )
            print(show(base, path, *request))
        return
    if args.video:
        raise RequestError("the OpenAI API here takes images, not video: drop --video")
    body: dict = {
        "model": openai_examples.model_id(args.model or "qwen_vl_lora", args.adapter),
        "messages": openai_examples.chat_messages(args.prompt, args.images, args.system_prompt),
    }
    if args.max_tokens:
        body["max_tokens"] = args.max_tokens
    if args.stream:
        body["stream"] = True
    show = openai_examples.chat_curl if args.show == "curl" else openai_examples.chat_python
    print(show(base, body, list(args.images)))


def _live(args) -> int:
    import asyncio

    from lora_client import live

    base = args.openai_url.rstrip("/")
    url = base.replace("https://", "wss://").replace("http://", "ws://") + "/realtime"
    model = openai_examples.model_id(args.model, args.adapter)

    async def run() -> None:
        if str(args.file) == "-":
            chunks = live.pipe_chunks(sys.stdin.buffer)
        else:
            chunks = live.file_chunks(args.file, args.speed)
        await live.stream(
            url,
            model,
            chunks,
            api_key=args.api_key,
            language=args.language,
            silence_ms=args.silence_ms,
        )

    try:
        asyncio.run(run())
    except (OSError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lora-client", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    transcribe = commands.add_parser("transcribe", help="speech file(s) -> text (whisper_lora)")
    transcribe.add_argument("files", nargs="+", type=Path)
    transcribe.add_argument(
        "--language",
        help="any language the model has, by code or name (de, german, yue, cantonese, jw, "
        "javanese, ...: openai-whisper's); default: detect",
    )
    transcribe.add_argument("--task", choices=["transcribe", "translate"])
    transcribe.add_argument("--timestamps", action="store_true", help="also print segments")
    transcribe.add_argument(
        "--word-timestamps",
        action="store_true",
        help="print one line per word: start, end (s), probability, word (openai-whisper's "
        "word timings)",
    )
    transcribe.add_argument(
        "--no-word-timestamps-refine",
        action="store_true",
        help="with --word-timestamps, openai-whisper's exact timings (no trimming to speech)",
    )
    transcribe.add_argument("--prompt", help="previous text (context for the first words)")
    transcribe.add_argument(
        "--hotwords",
        help="hint words or phrases (faster-whisper's: given as previous text, before --prompt)",
    )
    transcribe.add_argument(
        "--prefix",
        help="the start of the transcript, decoding continues from it (first window; not "
        "with --timestamps)",
    )
    transcribe.add_argument(
        "--suppress-tokens",
        help='token ids never emitted, as openai-whisper: "-1" (default) the model\'s non-speech '
        'set, "-1,1234" adds to it, "" none',
    )
    transcribe.add_argument(
        "--no-suppress-blank",
        action="store_true",
        help="let the first token be a blank or end of text",
    )
    transcribe.add_argument(
        "--vad-filter",
        action="store_true",
        help="drop non-speech first (Silero VAD, as faster-whisper); times stay the file's",
    )
    transcribe.add_argument(
        "--beam-size", type=int, help="beam search width (default 1: greedy; faster-whisper's: 5)"
    )
    transcribe.add_argument(
        "--beam-rule",
        choices=("transformers", "faster-whisper"),
        help="whose beam search: transformers' generate() (default) or faster-whisper's "
        "(CTranslate2's; also with --timestamps)",
    )
    transcribe.add_argument(
        "--temperature",
        type=float,
        nargs="+",
        help="one temperature (no fallback), or the schedule tried while a window fails its "
        "checks (default 0 0.2 0.4 0.6 0.8 1)",
    )
    transcribe.add_argument(
        "--no-condition-on-previous-text",
        action="store_true",
        help="with --timestamps, do not give each window the text before it",
    )
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
    live = commands.add_parser(
        "live", help="stream speech (a file, or - for a microphone's raw PCM) to /v1/realtime"
    )
    live.add_argument(
        "file", type=Path, help="a speech file, or - for raw PCM16 mono 24 kHz on standard input"
    )
    live.add_argument("--adapter", help="LoRA adapter name (default: the base model)")
    live.add_argument("--model", default="whisper_lora", help="Triton model name")
    live.add_argument("--language", help="language code (default: detect)")
    live.add_argument(
        "--silence-ms", type=int, default=500, help="silence that ends a turn (server VAD)"
    )
    live.add_argument(
        "--speed", type=float, default=1.0, help="times real time, for a file (default 1)"
    )
    live.add_argument(
        "--openai-url",
        default=openai_examples.DEFAULT_BASE_URL,
        help=f"lora-openai's base URL (default {openai_examples.DEFAULT_BASE_URL})",
    )
    live.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    listing = commands.add_parser("list-adapters", help="each model's adapters and their state")
    adapters = commands.add_parser("adapters", help="list, rescan, load or unload adapters")
    adapters.add_argument("action", choices=["list", "rescan", "load", "unload"])
    adapters.add_argument("arguments", nargs="*", help="load: NAME [PATH]; unload: NAME")
    for command in (listing, adapters):
        command.add_argument(
            "--model", help=f"one model (default for listing: {', '.join(MODELS)})"
        )
        command.add_argument("--url", help="host:port (default 127.0.0.1:8001 gRPC, :8000 HTTP)")
        command.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
        command.add_argument("--json", action="store_true", help="print the JSON answer")
    listing.set_defaults(arguments=[])
    args = parser.parse_args(argv)
    if args.command == "live":
        return _live(args)
    url = args.url or DEFAULT_URL[args.protocol]

    try:
        if args.command in ("list-adapters", "adapters"):
            _adapters(args, url)
        elif getattr(args, "show", None):
            _show(args)
        elif args.command == "transcribe":
            for path in args.files:
                fields = transcription_fields(
                    path,
                    language=args.language,
                    task=args.task,
                    prompt=args.prompt,
                    timestamps=args.timestamps or args.word_timestamps,
                    stream=args.stream,
                    max_tokens=args.max_tokens,
                    decoding=_decoding(args),
                )
                if len(args.files) > 1:
                    print(f"{path}: ", end="")
                replies = send(
                    url, args.protocol, args.model or "whisper_lora", fields, adapter=args.adapter
                )
                final = _print_replies(replies, stream=args.stream, final_is_full_text=True)
                if args.timestamps:
                    _print_segments(final)
                if args.word_timestamps:
                    _print_words(final)
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
