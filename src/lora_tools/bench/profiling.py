"""py-spy on the processes behind a missed goal: where their CPU time goes, in the report.

`py-spy record --format raw` writes collapsed stacks ("outer;...;leaf count" per line, idle
threads left out), so the samples are CPU time. Each process is summarised by the share spent
waiting (vLLM's queues spin), its busiest leaf frames (self time: the Python line that was
running, native work included under the line that called it) and the functions of our code and
vLLM's that the busy samples ran under (inclusive).
"""

import re
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from lora_serving.launcher import py_spy

FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^():]+)(?::(?P<line>\d+))?\)$")


# Leaf frames of threads that wait or spin (vLLM's shared-memory queues busy-poll, so waiting
# shows up as CPU samples; with cpu_no_spin a reader waits in zmq's Poller.poll, woken every
# 1 ms): counted as "waiting", left out of the frame lists.
WAITING = re.compile(
    r"^(sched_yield|SpinCondition\.wait|memory_fence|MessageQueue\.acquire_(read|write)\b.*|"
    r"MessageQueue\.ReadTimeoutWithWarnings\..*|\w*Selector\.select|Condition\.wait|"
    r"Event\.wait|Queue\.get|_wait_for_tstate_lock|select|poll|Poller\.poll|epoll_wait)$"
)
# Inclusive shares are listed for frames of these packages (our code and vLLM's).
INCLUSIVE_PREFIXES = ("lora_serving/", "vllm/", "transformers/", "triton_python_backend_utils")


@dataclass(frozen=True)
class ProfileSummary:
    label: str
    samples: int
    waiting: float  # share of samples in waiting / spinning frames
    top_frames: list[tuple[str, float]]  # busy leaf frames (self time), share of all samples
    top_inclusive: list[tuple[str, float]]  # our / vLLM functions on busy stacks (inclusive)

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "samples": self.samples,
            "waiting": self.waiting,
            "top_frames": [list(item) for item in self.top_frames],
            "top_inclusive": [list(item) for item in self.top_inclusive],
        }


def _short_file(path: str) -> str:
    for marker in ("site-packages/", "src/", "lib/python3.11/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def _parse_frame(frame: str) -> tuple[str, str, str]:
    """'function (path:line)' -> (function, short path, line)."""
    match = FRAME.match(frame.strip())
    if not match:
        return frame.strip(), "", ""
    return match["function"], _short_file(match["file"]), match["line"] or "?"


def summarize_collapsed(label: str, text: str, top: int = 8) -> ProfileSummary:
    frames: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = waiting = busy = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        total += samples
        parsed = [_parse_frame(frame) for frame in stack.split(";")]
        function, path, number = parsed[-1]
        if WAITING.match(function) or path.endswith("shm_broadcast.py"):
            waiting += samples
            continue
        busy += samples
        frames[f"{function} ({path}:{number})" if path else function] += samples
        seen = {f"{f} ({p})" for f, p, _ in parsed if p.startswith(INCLUSIVE_PREFIXES)}
        for name in seen:
            inclusive[name] += samples
    share = (lambda n: n / total) if total else (lambda n: 0.0)
    listed = [(name, n) for name, n in inclusive.most_common() if busy and n / busy < 0.9]
    return ProfileSummary(
        label=label,
        samples=total,
        waiting=share(waiting),
        top_frames=[(name, share(n)) for name, n in frames.most_common(top)],
        top_inclusive=[(name, share(n)) for name, n in listed[:top]],
    )


class Recorder:
    """py-spy attached to several processes for a fixed time, in the background."""

    def __init__(self, pids: dict[str, int], seconds: float, folder: Path, rate: int = 50):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        binary = py_spy()
        if binary is None:
            raise RuntimeError("py-spy is not installed (requirements/cpu.txt pins it)")
        self.outputs = {label: folder / f"{label}.collapsed" for label in pids}
        self.processes = {
            label: subprocess.Popen(
                [
                    binary,
                    "record",
                    *("--pid", str(pid), "--duration", str(max(1, round(seconds)))),
                    *("--rate", str(rate), "--format", "raw", "--nonblocking"),
                    *("--output", str(self.outputs[label])),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for label, pid in pids.items()
        }

    def finish(self, timeout_s: float = 120) -> list[ProfileSummary]:
        summaries = []
        for label, process in self.processes.items():
            try:
                _, err = process.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                _, err = process.communicate()
            path = self.outputs[label]
            if path.exists():
                summaries.append(summarize_collapsed(label, path.read_text()))
            else:
                failed = f"{label} (py-spy: {err.strip()[-200:]})"
                summaries.append(ProfileSummary(failed, 0, 0.0, [], []))
        return summaries
