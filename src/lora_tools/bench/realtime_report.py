"""The live-transcription bench's numbers and report (lora_tools.bench.realtime_latency): which
completed turn belongs to which sentence, each session's latencies, results.json -> report.md and
one PNG plot. Plain data in, text out (unit-tested); only `plot` draws."""

from pathlib import Path

import numpy as np

CHUNK_MS = 40
WER_BAR_POINTS = 1.0  # issue 31: live WER equals the file path's within 1 point


# ---- spans and turns (pure) --------------------------------------------------------------------
def chunk_sent_at(second: float, chunk_ms: int = CHUNK_MS) -> float:
    """When the chunk holding the sample at `second` was sent: chunks go out at real-time pace
    and the one holding sample t is sent when the next chunk is due."""
    return (int(second * 1000 / chunk_ms) + 1) * chunk_ms / 1000


def byte_range(
    span: tuple[float, float], rate: int, before_s: float = 0.0, after_s: float = 0.0
) -> tuple[int, int]:
    """The PCM16 byte offsets of `span` (seconds) in a recording at `rate`, last sample included,
    widened by `before_s` and `after_s` (not before the recording's start)."""
    start = max(0, int(round((span[0] - before_s) * rate)))
    end = int(round((span[1] + after_s) * rate))
    return 2 * start, 2 * (end + 1)


def turn_byte_range(turn_span: tuple[float, float], rate: int) -> tuple[int, int]:
    """The PCM16 byte offsets of a live turn's own audio, cut where its VAD events say
    (`audio_start_ms`, `audio_end_ms`; kept here in seconds), as the server cuts the turn."""
    start_ms, end_ms = (int(round(second * 1000)) for second in turn_span)
    return start_ms * rate // 1000 * 2, end_ms * rate // 1000 * 2


def match_turns(turns: list[tuple[float, float]], spans: list[tuple[float, float]]) -> dict:
    """span index -> turn index, for the sentences that got a turn of their own: the turn (its
    VAD start and end, seconds) overlaps that sentence's speech and no other sentence's, and no
    other turn overlaps that sentence. Sentences merged into one turn or split over two are left
    out (their latencies would mean nothing); the caller counts them."""

    def overlaps(a, b):
        return a[0] < b[1] and b[0] < a[1]

    matched = {}
    for t, turn in enumerate(turns):
        hit = [s for s, span in enumerate(spans) if overlaps(turn, span)]
        if len(hit) != 1:
            continue
        s = hit[0]
        if sum(overlaps(other, spans[s]) for other in turns) == 1:
            matched[s] = t
    return matched


def session_numbers(turns: list[dict], spans: list[tuple[float, float]]) -> dict:
    """One session's latencies from its turns, each {"start_s", "end_s" (VAD, audio seconds),
    "completed_at" (seconds after the first chunk), "text", "deltas": [[at, text], ...]}, in the
    order they completed."""
    matched = match_turns([(t["start_s"], t["end_s"]) for t in turns], spans)
    found = {
        "turns": len(turns),
        "sentences": len(spans),
        "one_turn_per_sentence": len(matched) == len(spans) == len(turns),
        "end_to_completed": [],
        "speech_to_first_delta": [],
        "retracted": 0,
        "texts": [t["text"] for t in sorted(turns, key=lambda t: t["start_s"])],
        "turn_spans": sorted([t["start_s"], t["end_s"]] for t in turns),
    }
    for s, t in sorted(matched.items()):
        turn, (speech_start, speech_end) = turns[t], spans[s]
        found["end_to_completed"].append(turn["completed_at"] - chunk_sent_at(speech_end))
        partial = [at for at, _ in turn["deltas"] if at < turn["completed_at"]]
        if partial:
            found["speech_to_first_delta"].append(partial[0] - chunk_sent_at(speech_start))
    for turn in turns:
        # a delta that was retracted: the deltas so far are not a prefix of the completed text
        if not turn["text"].startswith("".join(delta for _, delta in turn["deltas"])):
            found["retracted"] += 1
    return found


def merge_sessions(sessions: list[dict]) -> dict:
    """One level: every session's latencies together, counts summed."""
    return {
        "sessions": len(sessions),
        "turns": sum(s["turns"] for s in sessions),
        "sentences": sum(s["sentences"] for s in sessions),
        "one_turn_per_sentence": all(s["one_turn_per_sentence"] for s in sessions),
        "end_to_completed": [v for s in sessions for v in s["end_to_completed"]],
        "speech_to_first_delta": [v for s in sessions for v in s["speech_to_first_delta"]],
        "retracted": sum(s["retracted"] for s in sessions),
        "texts": [s["texts"] for s in sessions],
        "turn_spans": [s["turn_spans"] for s in sessions],
    }


def same_texts(live: list[str], files: list[str]) -> dict:
    """How many live turns read exactly as their sentence's file upload, and how many have the
    same words after Whisper's English normaliser (the cuts differ by a few frames)."""
    from lora_tools.finetune import metrics

    pairs = list(zip(live, files, strict=False))
    return {
        "exact": sum(a == b for a, b in pairs),
        "same_words": sum(metrics.words(a) == metrics.words(b) for a, b in pairs),
        "of": len(files),
    }


def own_audio_line(own: dict) -> str:
    return (
        f"Live turns equal to the file transcription of their own audio (cut at the turn's VAD "
        f"events, uploaded to /v1/audio/transcriptions): {own['exact']}/{own['of']}"
    )


def percentiles(values: list[float]) -> dict | None:
    """p50 and p90 in seconds, None without values."""
    if not values:
        return None
    p50, p90 = np.percentile(values, [50, 90])
    return {"p50": float(p50), "p90": float(p90)}


# ---- report (pure) -----------------------------------------------------------------------------
def _seconds(pair: dict | None) -> str:
    return "-" if pair is None else f"{pair['p50']:.2f} s / {pair['p90']:.2f} s"


def wer_line(wer: dict) -> str:
    live, file = wer["live"]["wer"], wer["file"]["wer"]
    points = (live - file) * 100
    verdict = "within" if abs(points) <= WER_BAR_POINTS else "NOT within"
    return (
        f"WER at 1 session: live (completed turns joined) {live * 100:.2f} % "
        f"({wer['live']['word_errors']}/{wer['live']['reference_words']} words), "
        f"file upload of the whole recording {file * 100:.2f} % "
        f"({wer['file']['word_errors']}/{wer['file']['reference_words']}): "
        f"{points:+.2f} points, {verdict} {WER_BAR_POINTS:g} point"
    )


def peer_line(peer: dict, live_one: dict | None) -> str:
    line = (
        f"Peer, each sentence's audio uploaded as a file after it ends (/v1/audio/transcriptions, "
        f"1 at a time, {len(peer['seconds'])} files, each cut as server VAD cuts a turn): "
        f"upload -> text {_seconds(peer['latency'])}"
    )
    if live_one is not None:
        line += f"; live at 1 session, end of speech -> completed {_seconds(live_one)}"
    same = peer.get("same_as_live")
    if same:
        line += (
            f". Live turns that read as their sentence's upload: {same['exact']}/{same['of']} "
            f"exactly, {same['same_words']}/{same['of']} after the normaliser"
        )
    return line


def render(results: dict) -> str:
    """report.md of results.json."""
    config = results["config"]
    lines = [
        "# Live transcription latency (/v1/realtime)",
        "",
        f"{config['model']}, {config['sentences']} espeak-ng sentences with "
        f"{config['pause_s']:g} s pauses, {config['audio_s']:.1f} s of audio per session streamed "
        f"at real-time pace in {config['chunk_ms']} ms chunks; OpenAI transcription session, "
        f"server VAD (silence_duration_ms {config['silence_ms']}: end of speech -> completed "
        f"includes that silence). Sessions of one level start up to 1 s apart.",
        "",
        "| sessions | turns | one turn per sentence | end of speech -> completed p50 / p90 "
        "| speech -> first delta p50 / p90 | retracted |",
        "|---:|---:|:---:|---:|---:|---:|",
    ]
    for count, level in sorted(results["levels"].items(), key=lambda kv: int(kv[0])):
        lines.append(
            f"| {count} | {level['turns']}/{level['sentences']} "
            f"| {'yes' if level['one_turn_per_sentence'] else 'NO'} "
            f"| {_seconds(level['end_to_completed_s'])} "
            f"| {_seconds(level['speech_to_first_delta_s'])} | {level['retracted']} |"
        )
    lines += ["", wer_line(results["wer"]), ""]
    if results.get("own_audio"):
        lines += [own_audio_line(results["own_audio"]), ""]
    live_one = results["levels"].get("1", {}).get("end_to_completed_s")
    lines += [peer_line(results["peer"], live_one), ""]
    if results.get("plot"):
        lines += [f"![latency vs sessions]({results['plot']})", ""]
    return "\n".join(lines)


def summarise_level(level: dict) -> dict:
    """A merged level with its percentiles, as results.json keeps it."""
    return {
        **level,
        "end_to_completed_s": percentiles(level["end_to_completed"]),
        "speech_to_first_delta_s": percentiles(level["speech_to_first_delta"]),
    }


# ---- plot --------------------------------------------------------------------------------------
def plot(results: dict, path: Path) -> None:
    """Latency p50/p90 vs sessions, the per-turn file upload as a horizontal reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted(results["levels"].items(), key=lambda kv: int(kv[0]))
    counts = [int(count) for count, _ in levels]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, color in (
        ("end_to_completed_s", "end of speech -> completed", "#4c72b0"),
        ("speech_to_first_delta_s", "speech -> first delta", "#dd8452"),
    ):
        points = [(c, level[key]) for c, (_, level) in zip(counts, levels, strict=True)]
        points = [(c, p) for c, p in points if p is not None]
        if not points:
            continue
        xs = [c for c, _ in points]
        ax.plot(xs, [p["p50"] for _, p in points], "o-", color=color, label=f"{label} p50")
        ax.plot(xs, [p["p90"] for _, p in points], "^--", color=color, label=f"{label} p90")
    peer = results["peer"]["latency"]
    if peer is not None:
        ax.axhline(peer["p50"], color="grey", linewidth=1, label="file upload per turn p50")
        ax.axhline(peer["p90"], color="grey", linestyle=":", label="file upload per turn p90")
    ax.set_xticks(counts)
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    ax.set_title(f"/v1/realtime latency, {results['config']['model']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
