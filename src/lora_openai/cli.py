"""lora-openai: the OpenAI-compatible API in front of a running tritonserver.

lora-openai --triton-url 127.0.0.1:8001 --port 9000 [--host 127.0.0.1] [--allow-image-urls]
            [--triton-metrics-url http://127.0.0.1:8002/metrics]
            [--api-key KEY | --api-keys-file keys.yaml]
"""

import argparse
import logging
import os
from pathlib import Path

from lora_openai.app import FrontSettings, MiB, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--triton-url",
        default=f"127.0.0.1:{os.environ.get('GRPC_PORT', 8001)}",
        help="Triton's gRPC address, HOST:PORT (default 127.0.0.1:$GRPC_PORT or :8001)",
    )
    parser.add_argument(
        "--triton-metrics-url",
        default=f"http://127.0.0.1:{os.environ.get('METRICS_PORT', 8002)}/metrics",
        help="Triton's metrics endpoint, read for this front's /metrics (the endpoint "
        "picker's protocol); default http://127.0.0.1:$METRICS_PORT/metrics or :8002",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("OPENAI_PORT", 9000)))
    parser.add_argument(
        "--max-body-mb", type=float, default=25, help="request size limit (413 above it)"
    )
    parser.add_argument(
        "--allow-image-urls",
        action="store_true",
        help="fetch http(s) image_url parts (default: data URLs / base64 only)",
    )
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument(
        "--api-key",
        default=os.environ.get("LORA_OPENAI_API_KEY") or None,
        help="one key (Authorization: Bearer KEY) for every model and the admin API, as "
        "vLLM's flag; default $LORA_OPENAI_API_KEY (keeps it off the command line)",
    )
    keys.add_argument(
        "--api-keys-file",
        type=Path,
        default=os.environ.get("LORA_OPENAI_API_KEYS_FILE") or None,
        help="YAML file of named keys (SHA-256 digests), their model id patterns, limits and "
        'admin flag; re-read when it changes (README "Tenants")',
    )
    parser.add_argument(
        "--open-metrics",
        action="store_true",
        help="serve /metrics without a key even when keys are configured (for a scraper that "
        "cannot send one; it names every key and model id, so keep it from tenants at the "
        "gateway); by default it then needs an admin key",
    )
    parser.add_argument(
        "--realtime-max-session-s",
        type=float,
        default=900,
        help="/v1/realtime: audio seconds one session may send (then an error event and close)",
    )
    parser.add_argument(
        "--realtime-max-turn-s",
        type=float,
        default=60,
        help="/v1/realtime: audio one turn may buffer; the turn is ended and transcribed there",
    )
    parser.add_argument(
        "--realtime-idle-timeout-s",
        type=float,
        default=60,
        help="/v1/realtime: a session with no client event for this long is closed",
    )
    parser.add_argument(
        "--realtime-max-partial-decodes",
        type=int,
        default=2,
        help="/v1/realtime: partial decodes (previews of a turn being spoken) in flight across "
        "every session; none start while a session's ended turn waits for its decode",
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    settings = FrontSettings(
        triton_url=args.triton_url,
        triton_metrics_url=args.triton_metrics_url,
        max_body_bytes=int(args.max_body_mb * MiB),
        allow_image_urls=args.allow_image_urls,
        api_key=args.api_key,
        api_keys_file=args.api_keys_file,
        open_metrics=args.open_metrics,
        realtime_max_session_s=args.realtime_max_session_s,
        realtime_max_turn_s=args.realtime_max_turn_s,
        realtime_idle_timeout_s=args.realtime_idle_timeout_s,
        realtime_max_partial_decodes=args.realtime_max_partial_decodes,
        # Never a flag (command lines are public): the same variable tritonserver reads.
        triton_control_token=os.environ.get("LORA_CONTROL_TOKEN") or None,
    )
    import uvicorn

    uvicorn.run(build(settings), host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
