"""Noisy neighbour on the OpenAI front: does a tenant over its rate limit slow another down?

  .venv/bin/python -m lora_tools.bench.noisy_neighbour [--seconds 60]

Starts tritonserver (whisper_lora only) and lora-openai with two keys: A limited to
`--a-rpm` requests per minute, B to `--b-rpm`. Phase 1: B alone sends transcriptions of one
espeak-ng sentence (whisper_lora/beta) at half its limit, open loop (a fixed schedule,
whatever the answers take). Phase 2: the same B schedule while A sends at 4x its limit
(whisper_lora/alpha). Prints B's errors and latency percentiles in each phase, A's answers by
status, and B's p50 with A over B's p50 alone.
"""

import argparse
import hashlib
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

from lora_tools.bench.processes import whisper_front


def _sender(url, key, model, audio, per_minute, seconds, results, start_at):
    """Requests at `per_minute` on a fixed schedule, each on its own thread (open loop)."""
    interval = 60.0 / per_minute
    threads = []

    def one():
        began = time.perf_counter()
        try:
            response = httpx.post(
                f"{url}/v1/audio/transcriptions",
                headers={"Authorization": f"Bearer {key}"},
                data={"model": model},
                files={"file": ("speech.wav", audio, "audio/wav")},
                timeout=120,
            )
            status = response.status_code
        except httpx.HTTPError:
            status = 0
        results.append((status, time.perf_counter() - began))

    index = 0
    while (send_at := start_at + index * interval) < start_at + seconds:
        time.sleep(max(0.0, send_at - time.monotonic()))
        thread = threading.Thread(target=one)
        thread.start()
        threads.append(thread)
        index += 1
    for thread in threads:
        thread.join()


def _phase(url, keys, audio, args, with_a: bool) -> tuple[list, list]:
    b_results, a_results = [], []
    start_at = time.monotonic() + 0.5
    senders = [
        threading.Thread(
            target=_sender,
            args=(url, keys["b"], "whisper_lora/beta", audio, args.b_rpm / 2, args.seconds),
            kwargs={"results": b_results, "start_at": start_at},
        )
    ]
    if with_a:
        senders.append(
            threading.Thread(
                target=_sender,
                args=(url, keys["a"], "whisper_lora/alpha", audio, args.a_rpm * 4, args.seconds),
                kwargs={"results": a_results, "start_at": start_at},
            )
        )
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    return b_results, a_results


def _summary(label: str, results: list) -> float:
    ok = sorted(latency for status, latency in results if status == 200)
    errors = len(results) - len(ok)
    p50 = statistics.median(ok) if ok else float("nan")
    p90 = ok[int(0.9 * (len(ok) - 1))] if ok else float("nan")
    print(f"{label:<22} {len(results):>5} {errors:>7} {p50 * 1000:>9.0f} {p90 * 1000:>9.0f}")
    return p50


def main(argv=None) -> int:
    sys.stdout.reconfigure(line_buffering=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Defaults keep B well under the engine's capacity on 2 busy cores (B alone never queues),
    # so a slowdown would show; A's admitted requests are real work beside B's.
    parser.add_argument("--seconds", type=float, default=120, help="length of each phase")
    parser.add_argument("--a-rpm", type=int, default=2, help="tenant A's requests per minute")
    parser.add_argument("--b-rpm", type=int, default=12, help="tenant B's requests per minute")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="noisy-neighbour-"))
    keys = {name: secrets.token_urlsafe(16) for name in ("a", "b", "warm-up")}
    limits = {"a": {"requests_per_minute": args.a_rpm}, "b": {"requests_per_minute": args.b_rpm}}
    entries = [
        {
            "name": f"tenant-{name}",
            "sha256": hashlib.sha256(key.encode()).hexdigest(),
            "models": ["whisper_lora/*"],
            "limits": limits.get(name, {}),
        }
        for name, key in keys.items()
    ]
    (work / "keys.yaml").write_text(yaml.safe_dump({"keys": entries}))
    speech = work / "speech.wav"
    subprocess.run(
        ["espeak-ng", "-w", str(speech), "The quick brown fox jumps over the lazy dog."],
        check=True,
    )
    audio = speech.read_bytes()
    with whisper_front(work, api_keys_file=work / "keys.yaml") as front:
        for model in ("alpha", "beta", "beta"):  # load both adapters (a third key: A's and
            began = time.perf_counter()  # B's windows start empty)
            httpx.post(
                f"{front.url}/v1/audio/transcriptions",
                headers={"Authorization": f"Bearer {keys['warm-up']}"},
                data={"model": f"whisper_lora/{model}"},
                files={"file": ("speech.wav", audio, "audio/wav")},
                timeout=120,
            ).raise_for_status()
        print(f"one request on an idle server: {(time.perf_counter() - began) * 1000:.0f} ms")
        print(
            f"B sends {args.b_rpm / 2:g}/min (limit {args.b_rpm}); A sends {args.a_rpm * 4}/min "
            f"(limit {args.a_rpm}); {args.seconds:g} s per phase"
        )
        print(f"{'':<22} {'sent':>5} {'errors':>7} {'p50 ms':>9} {'p90 ms':>9}")
        alone, _ = _phase(front.url, keys, audio, args, with_a=False)  # B stays under its limit
        noisy, a_results = _phase(front.url, keys, audio, args, with_a=True)
        p50_alone = _summary("B alone", alone)
        p50_noisy = _summary("B with A at 4x limit", noisy)
        _summary("A (200 only)", a_results)
        statuses: dict[int, int] = {}
        for status, _ in a_results:
            statuses[status] = statuses.get(status, 0) + 1
        refused = sorted(latency for status, latency in a_results if status == 429)
        print(f"A's answers by status: {dict(sorted(statuses.items()))}")
        if refused:
            print(f"A's 429s: p50 {statistics.median(refused) * 1000:.1f} ms")
        print(f"B p50 with A / B p50 alone: {p50_noisy / p50_alone:.3f}")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
