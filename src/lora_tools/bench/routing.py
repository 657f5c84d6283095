"""Routing study (issue 16): what adapter-affinity routing by the endpoint picker would gain over
round-robin, measured on two replicas of the real server. A test harness, not a router.

    python -m lora_tools.bench.routing --out docs/routing-study    (make routing-study)

Two replicas (tritonserver with whisper_lora only + lora-openai each; engine on its own core,
few LoRA slots) serve a replayed trace: requests for many adapters with Zipf popularity,
arriving as a Poisson process, each sent to a replica's OpenAI front as
/v1/audio/transcriptions. Every policy runs on freshly started replicas, on the same trace:

- `round_robin`: replica 0, 1, 0, 1, ...
- `picker`: the endpoint picker's published scoring (llm-d Router v0.10.0: queue-scorer,
  kv-cache-utilization-scorer, lora-affinity-scorer, weights of k8s/inference-gateway/epp.yaml,
  max-score-picker; `lora_tools.bench.picker`) over each replica's /metrics as last scraped
  (every 50 ms, the picker's default period, in every policy);
- `picker_running`: the same plus the picker's running-requests-size-scorer (weight 1);
- `picker_warm` (what-if, not the protocol): `picker` with the adapters sitting in a replica's
  LoRA slots counted as running (the protocol's text describes running_lora_adapters as
  "loaded in GPU memory and ready to serve"; vLLM, and we, publish adapters of running
  requests), read from each replica's `adapter_command` "list" every 250 ms.

Measured per policy: adapter loads per request (Triton's lora_adapter_slot_loads_total /
lora_adapter_cache_loads_total, both replicas, over the replay), latency p50/p99 (send to
answer), throughput (answers / time from first send to last answer), and how often the chosen
replica was running the adapter when the request was routed. Writes results.json, report.md
and routing.png into --out.
"""

import argparse
import asyncio
import json
import math
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
MODEL = "whisper_lora"
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "The meeting starts at nine and should end before noon.",
    "Turn left at the second light, then keep going until the river.",
    "She sells sea shells by the sea shore every summer.",
    "Our team will ship the new release next week.",
    "Rain is expected in the north later this evening.",
    "Could you please speak a little more slowly?",
]


@dataclass(frozen=True)
class StudyConfig:
    adapters: int = 12  # adapters in the trace
    zipf_s: float = 1.0  # popularity of the adapter of rank k is proportional to 1 / k^s
    requests: int = 200
    rate_rps: float = 2.0  # Poisson arrivals
    max_loras: int = 2  # LoRA slots per engine (small: slots are what routing saves)
    max_cpu_loras: int = 4  # adapter cache per engine (smaller than the adapter count)
    max_num_seqs: int = 8
    max_tokens: int = 32
    seed: int = 16
    scrape_interval_s: float = 0.05
    policies: tuple[str, ...] = ("round_robin", "picker", "picker_running")


@dataclass(frozen=True)
class TraceItem:
    at_s: float  # offset from the start of the replay
    adapter: str
    sentence: int


def adapter_names(count: int) -> list[str]:
    return [f"r{index:02d}" for index in range(count)]


def zipf_weights(count: int, s: float) -> list[float]:
    raw = [1 / (rank**s) for rank in range(1, count + 1)]
    return [w / sum(raw) for w in raw]


def make_trace(config: StudyConfig) -> list[TraceItem]:
    """The same trace for every policy: Poisson arrivals, Zipf-popular adapters."""
    rng = random.Random(config.seed)
    names = adapter_names(config.adapters)
    weights = zipf_weights(config.adapters, config.zipf_s)
    at, items = 0.0, []
    for _ in range(config.requests):
        items.append(
            TraceItem(
                round(at, 4),
                rng.choices(names, weights)[0],
                rng.randrange(len(SENTENCES)),
            )
        )
        at += rng.expovariate(config.rate_rps)
    return items


# ---- policies ---------------------------------------------------------------------------------
class RoundRobin:
    name = "round_robin"

    def __init__(self, replicas: int, seed: int):
        self._next, self._replicas = 0, replicas

    def choose(self, model_id: str, views: list) -> int:
        choice = self._next
        self._next = (self._next + 1) % self._replicas
        return choice


class PickerScoring:
    name = "picker"
    extra_weights: dict[str, float] = {}

    def __init__(self, replicas: int, seed: int):
        from lora_tools.bench.picker import WEIGHTS

        self._rng = random.Random(seed)
        self.weights = {**WEIGHTS, **self.extra_weights}

    def choose(self, model_id: str, views: list) -> int:
        from lora_tools.bench.picker import pick

        endpoints = {str(index): view for index, view in enumerate(views)}
        return int(pick(model_id, endpoints, self.weights, rng=self._rng))


class PickerWithRunning(PickerScoring):
    name = "picker_running"
    extra_weights = {"running-requests-size-scorer": 1.0}


class PickerWarmSlots(PickerScoring):
    """What-if: the LoRA affinity scorer told which adapters sit in each replica's slots."""

    name = "picker_warm"
    wants_slots = True

    def choose(self, model_id: str, views: list, slots: list | None = None) -> int:
        import dataclasses

        if slots is not None:
            views = [
                dataclasses.replace(view, active_models=view.active_models | warm)
                for view, warm in zip(views, slots, strict=True)
            ]
        return super().choose(model_id, views)


POLICIES = {
    policy.name: policy
    for policy in (RoundRobin, PickerScoring, PickerWithRunning, PickerWarmSlots)
}


async def poll_slots(grpc_url: str, slots: list, index: int, stop, interval_s=0.25) -> None:
    """slots[index] = ids of the adapters in the replica's LoRA slots (its "list" answer)."""
    from lora_client.requests import control_parameters

    from lora_openai.triton import TritonGateway

    gateway = TritonGateway(grpc_url)
    try:
        while not stop.is_set():
            try:
                # with the token: a listing without it has names only, no states
                reply = await gateway.complete(
                    MODEL, {"adapter_command": "list"}, control_parameters()
                )
                listing = json.loads(reply.outputs.get("text_output") or "{}")
                slots[index] = frozenset(
                    f"{MODEL}/{a['name']}"
                    for a in listing.get("adapters", [])
                    if a.get("state") == "loaded"
                )
            except Exception:  # keep the last listing
                pass
            await asyncio.sleep(interval_s)
    finally:
        await gateway.close()


# ---- results ----------------------------------------------------------------------------------
@dataclass
class Outcome:
    adapter: str
    replica: int
    sent_at: float
    latency_s: float
    ok: bool
    affinity_hit: bool  # the chosen replica's last view listed the adapter as running
    error: str = ""


@dataclass
class PolicyResult:
    policy: str
    outcomes: list[Outcome]
    slot_loads: int
    cache_loads: int
    wall_s: float
    views: list[list[int]] = field(default_factory=list)  # [t, running adapters per replica]
    other_cpu_cores: float = math.nan  # CPU used by processes not of this study, during replay

    def busier_choices(self) -> tuple[float, float]:
        """(share of requests sent to the replica with more requests in flight, mean of
        in flight there minus in flight on the other), from the client's own timings."""
        busier, difference = 0, 0
        for o in self.outcomes:
            counts = Counter(
                p.replica for p in self.outcomes if p.sent_at < o.sent_at <= p.sent_at + p.latency_s
            )
            mine, other = counts[o.replica], counts[1 - o.replica]
            busier += mine > other
            difference += mine - other
        return busier / len(self.outcomes), difference / len(self.outcomes)

    def summary(self) -> dict:
        from lora_tools.bench.stats import percentile

        ok = [o for o in self.outcomes if o.ok]
        busier, difference = self.busier_choices()
        latencies = [o.latency_s for o in ok]
        per_replica = Counter(o.replica for o in self.outcomes)
        return {
            "policy": self.policy,
            "requests": len(self.outcomes),
            "errors": len(self.outcomes) - len(ok),
            "slot_loads": self.slot_loads,
            "cache_loads": self.cache_loads,
            "slot_loads_per_request": self.slot_loads / len(self.outcomes),
            "cache_loads_per_request": self.cache_loads / len(self.outcomes),
            "p50_s": percentile(latencies, 50) if latencies else math.nan,
            "p99_s": percentile(latencies, 99) if latencies else math.nan,
            "mean_s": sum(latencies) / len(latencies) if latencies else math.nan,
            "throughput_rps": len(ok) / self.wall_s if self.wall_s else math.nan,
            "wall_s": self.wall_s,
            "affinity_hits": sum(o.affinity_hit for o in self.outcomes) / len(self.outcomes),
            "requests_per_replica": [per_replica.get(i, 0) for i in range(2)],
            "sent_to_busier_replica": busier,
            "in_flight_difference": difference,
            "other_cpu_cores": self.other_cpu_cores,
        }

    @classmethod
    def from_json(cls, policy: str, data: dict) -> "PolicyResult":
        (summary,) = [s for s in data["summaries"] if s["policy"] == policy]
        outcomes = [Outcome(**o) for o in data["outcomes"][policy]]
        return cls(
            policy,
            outcomes,
            summary["slot_loads"],
            summary["cache_loads"],
            summary["wall_s"],
            data["timelines"][policy],
            summary.get("other_cpu_cores", math.nan),
        )


# ---- replicas ---------------------------------------------------------------------------------
def build_repository(config: StudyConfig, work: Path, core: int, adapters: dict[str, Path]):
    """whisper_lora for one replica: the shipped config, few slots, its engine on `core`."""
    from lora_tools.bench.repository import _write_model, bench_model_json

    source = REPO / "model_repository"
    shipped_dir = source / MODEL / "1"
    shipped = json.loads((shipped_dir / "model.json").read_text())
    model_json = bench_model_json(
        shipped,
        shipped_dir,
        lora=True,
        max_loras=config.max_loras,
        max_cpu_loras=config.max_cpu_loras,
        engine_overrides={"max_num_seqs": config.max_num_seqs},
        environment_overrides={"VLLM_CPU_OMP_THREADS_BIND": str(core)},
    )
    repo = work / f"repository-{core}"
    folder = _write_model(source, MODEL, repo, MODEL, model_json)
    (folder / "multi_lora.json").write_text(
        json.dumps({name: str(path) for name, path in adapters.items()}, indent=2)
    )
    return repo


class Replica:
    """tritonserver (whisper_lora) + lora-openai, as `make serve` runs them."""

    def __init__(self, repo: Path, index: int, logs: Path):
        from lora_serving.launcher import TritonServer
        from lora_tools.bench.processes import free_port

        self.index = index
        self.logs = logs
        self.server = TritonServer(
            repo,
            http=free_port(),
            grpc=free_port(),
            metrics=free_port(),
            extra_args=["--model-control-mode=explicit", f"--load-model={MODEL}"],
            log_path=logs / f"tritonserver-{index}.log",
        )
        self.front = None

    def start_front(self) -> None:
        from lora_serving.launcher import OpenAIFront
        from lora_tools.bench.processes import free_port

        self.front = OpenAIFront(
            self.server.grpc,
            free_port(),
            triton_metrics=self.server.metrics,
            log_path=self.logs / f"lora-openai-{self.index}.log",
        )
        self.front.wait_listening()

    @property
    def url(self) -> str:
        return self.front.url

    def adapter_loads(self) -> tuple[int, int]:
        """(slot loads, cache loads) so far, from Triton's metrics."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        url = f"http://127.0.0.1:{self.server.metrics}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        totals = {"lora_adapter_slot_loads": 0.0, "lora_adapter_cache_loads": 0.0}
        for family in text_string_to_metric_families(text):
            if family.name in totals:
                totals[family.name] += sum(
                    s.value for s in family.samples if s.name.endswith("_total")
                )
        return int(totals["lora_adapter_slot_loads"]), int(totals["lora_adapter_cache_loads"])

    def stop(self) -> None:
        if self.front is not None:
            self.front.stop()
        self.server.stop()


def synthesise(work: Path) -> list[bytes]:
    folder = work / "speech"
    folder.mkdir(parents=True, exist_ok=True)
    audio = []
    for index, text in enumerate(SENTENCES):
        path = folder / f"{index}.wav"
        if not path.exists():
            subprocess.run(
                ["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(path), text],
                check=True,
                capture_output=True,
            )
        audio.append(path.read_bytes())
    return audio


# ---- replay -----------------------------------------------------------------------------------
def form(model_id: str, max_tokens: int) -> dict:
    # No temperature fallback: every request decodes once (greedy), so both policies do the
    # same work per request.
    return {
        "model": model_id,
        "language": "en",
        "max_tokens": str(max_tokens),
        "compression_ratio_threshold": "null",
        "logprob_threshold": "null",
        "no_speech_threshold": "null",
    }


async def replay(config, trace, audio, replicas, policy) -> PolicyResult:
    import httpx

    from lora_tools.bench.picker import read_endpoint_metrics

    urls = [replica.url for replica in replicas]
    views: list = [None] * len(urls)
    timeline: list[list[int]] = []
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)

    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def scrape(index: int) -> None:
            while not stop.is_set():
                try:
                    response = await client.get(f"{urls[index]}/metrics", timeout=2)
                    views[index] = read_endpoint_metrics(response.text)
                except Exception:  # a missed scrape keeps the last view, as the picker does
                    pass
                await asyncio.sleep(config.scrape_interval_s)

        scrapers = [asyncio.create_task(scrape(i)) for i in range(len(urls))]
        slots = None
        if getattr(policy, "wants_slots", False):
            slots = [frozenset()] * len(urls)
            scrapers += [
                asyncio.create_task(poll_slots(f"127.0.0.1:{r.server.grpc}", slots, i, stop))
                for i, r in enumerate(replicas)
            ]
        while any(v is None for v in views):
            await asyncio.sleep(0.05)
        start = time.monotonic()

        async def record_views() -> None:
            while not stop.is_set():
                timeline.append(
                    [round(time.monotonic() - start, 2)]
                    + [len(v.active_models) + len(v.waiting_models) for v in views]
                )
                await asyncio.sleep(0.5)

        recorder = asyncio.create_task(record_views())

        async def send(item: TraceItem, index: int, hit: bool) -> Outcome:
            model_id = f"{MODEL}/{item.adapter}"
            sent = time.monotonic()
            try:
                response = await client.post(
                    f"{urls[index]}/v1/audio/transcriptions",
                    files={"file": ("speech.wav", audio[item.sentence], "audio/wav")},
                    data=form(model_id, config.max_tokens),
                )
                ok, error = (
                    response.status_code == 200,
                    "" if response.is_success else response.text,
                )
            except httpx.HTTPError as err:
                ok, error = False, repr(err)
            return Outcome(
                item.adapter, index, sent - start, time.monotonic() - sent, ok, hit, error[:200]
            )

        tasks = []
        for item in trace:
            delay = start + item.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            model_id = f"{MODEL}/{item.adapter}"
            snapshot = list(views)
            if slots is None:
                index = policy.choose(model_id, snapshot)
            else:
                index = policy.choose(model_id, snapshot, list(slots))
            hit = model_id in snapshot[index].active_models
            tasks.append(asyncio.create_task(send(item, index, hit)))
        outcomes = await asyncio.gather(*tasks)
        wall = max(o.sent_at + o.latency_s for o in outcomes)
        stop.set()
        await asyncio.gather(*scrapers, recorder)
    return PolicyResult(policy.name, list(outcomes), 0, 0, wall, timeline)


def warm_up(replicas, audio) -> None:
    """One base-model request per replica (first-request costs), then wait for idle."""
    import httpx

    for replica in replicas:
        response = httpx.post(
            f"{replica.url}/v1/audio/transcriptions",
            files={"file": ("speech.wav", audio[0], "audio/wav")},
            data=form(MODEL, 8),
            timeout=300,
        )
        response.raise_for_status()


def cpu_seconds() -> tuple[float, float]:
    """(CPU seconds the machine has been busy, CPU seconds of this process and its children)."""
    import psutil

    times = psutil.cpu_times()
    busy = sum(  # guest time is already in user time
        getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal")
    )
    ours = 0.0
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            used = process.cpu_times()
            ours += used.user + used.system
        except psutil.Error:
            pass
    return busy, ours


def run_policy(config, name, trace, audio, adapters, work, label=None) -> PolicyResult:
    label = label or name
    logs = work / "logs" / label
    logs.mkdir(parents=True, exist_ok=True)
    repos = [build_repository(config, work, core, adapters) for core in (0, 1)]
    replicas = [Replica(repo, index, logs) for index, repo in enumerate(repos)]
    try:
        started = time.monotonic()
        for replica in replicas:
            replica.server.wait_ready(timeout_s=600)
        for replica in replicas:
            replica.start_front()
        print(f"[{label}] two replicas ready in {time.monotonic() - started:.0f} s", flush=True)
        warm_up(replicas, audio)
        before = [replica.adapter_loads() for replica in replicas]
        policy = POLICIES[name](len(replicas), config.seed)
        cpu_before = cpu_seconds()
        result = asyncio.run(replay(config, trace, audio, replicas, policy))
        cpu_after = cpu_seconds()
        result.policy = label
        other = (cpu_after[0] - cpu_before[0]) - (cpu_after[1] - cpu_before[1])
        result.other_cpu_cores = max(0.0, other) / result.wall_s
        time.sleep(1.0)  # the last jobs' counts reach Triton's metrics
        after = [replica.adapter_loads() for replica in replicas]
        result.slot_loads = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
        result.cache_loads = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
        summary = result.summary()
        print(f"[{label}] {json.dumps(summary)}", flush=True)
        return result
    finally:
        for replica in replicas:
            replica.stop()


def make_adapters(config: StudyConfig, work: Path) -> dict[str, Path]:
    from lora_tools.demo.whisper import make_whisper_adapters

    base = REPO / "demo_models" / "whisper-base"
    folders = make_whisper_adapters(
        base, work / "adapters", names=adapter_names(config.adapters), seed=config.seed
    )
    return {folder.name: folder.resolve() for folder in folders}


# ---- report -----------------------------------------------------------------------------------
def plot(results: list[PolicyResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for result in results:
        latencies = sorted(o.latency_s for o in result.outcomes if o.ok)
        ys = [(i + 1) / len(latencies) for i in range(len(latencies))]
        left.plot(latencies, ys, label=result.policy)
    left.set_xlabel("latency (s)")
    left.set_ylabel("fraction of requests")
    left.set_title("Latency, send to answer")
    left.legend()
    names = [r.policy for r in results]
    per_request = [r.slot_loads / len(r.outcomes) for r in results]
    cache = [r.cache_loads / len(r.outcomes) for r in results]
    xs = range(len(names))
    right.bar([x - 0.2 for x in xs], per_request, 0.4, label="into a LoRA slot")
    right.bar([x + 0.2 for x in xs], cache, 0.4, label="from disk into the cache")
    right.set_xticks(list(xs), names, rotation=25, ha="right")
    right.set_ylabel("adapter loads per request")
    right.set_title("Adapter loads")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(config: StudyConfig, results: list[PolicyResult], trace, out: Path) -> str:
    rows = [r.summary() for r in results]
    popularity = Counter(item.adapter for item in trace)
    top = ", ".join(f"{name} {count}" for name, count in popularity.most_common(4))
    lines = [
        "| policy | slot loads / request | disk loads / request | p50 s | p99 s | mean s "
        "| throughput req/s | chosen replica ran the adapter | sent to the busier replica "
        "| requests per replica | errors | other processes' CPU (cores) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['policy']} | {row['slot_loads_per_request']:.3f} ({row['slot_loads']}) "
            f"| {row['cache_loads_per_request']:.3f} ({row['cache_loads']}) "
            f"| {row['p50_s']:.2f} | {row['p99_s']:.2f} | {row['mean_s']:.2f} "
            f"| {row['throughput_rps']:.2f} | {row['affinity_hits']:.0%} "
            f"| {row['sent_to_busier_replica']:.0%} "
            f"| {row['requests_per_replica']} | {row['errors']} "
            f"| {row['other_cpu_cores']:.2f} |"
        )
    return "\n".join(
        [
            f"Trace: {config.requests} requests, Poisson arrivals at {config.rate_rps} req/s, "
            f"{config.adapters} adapters with Zipf popularity (s = {config.zipf_s}; most "
            f"requested: {top}), seed {config.seed}. Replicas: 2 x (tritonserver + lora-openai), "
            f"whisper_lora only, max_loras {config.max_loras}, max_cpu_loras "
            f"{config.max_cpu_loras}, max_num_seqs {config.max_num_seqs}, each engine bound to "
            f"its own core; {config.max_tokens} tokens at most per request, greedy, no fallback.",
            "",
            *lines,
            "",
            "![latency and adapter loads](routing.png)",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "results" / "routing-study")
    parser.add_argument("--work", type=Path, default=REPO / "results" / "work" / "routing")
    defaults = StudyConfig()
    for name in ("adapters", "requests", "max_loras", "max_cpu_loras", "max_tokens", "seed"):
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name)
        )
    parser.add_argument("--rate-rps", type=float, default=defaults.rate_rps)
    parser.add_argument("--zipf-s", type=float, default=defaults.zipf_s)
    parser.add_argument("--policies", nargs="+", default=list(defaults.policies))
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite table.md and routing.png from --out's results.json (no servers)",
    )
    args = parser.parse_args(argv)
    if args.report_only:
        data = json.loads((args.out / "results.json").read_text())
        config = StudyConfig(**{**data["config"], "policies": tuple(data["config"]["policies"])})
        results = [PolicyResult.from_json(s["policy"], data) for s in data["summaries"]]
        write_report(config, results, make_trace(config), args.out, data)
        return 0
    if shutil.which("espeak-ng") is None:
        print("espeak-ng is missing: run `make setup`", file=sys.stderr)
        return 1
    config = StudyConfig(
        adapters=args.adapters,
        zipf_s=args.zipf_s,
        requests=args.requests,
        rate_rps=args.rate_rps,
        max_loras=args.max_loras,
        max_cpu_loras=args.max_cpu_loras,
        max_tokens=args.max_tokens,
        seed=args.seed,
        policies=tuple(args.policies),
    )
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    adapters = make_adapters(config, args.work)
    audio = synthesise(args.work)
    trace = make_trace(config)
    results, seen = [], Counter()
    for name in config.policies:  # a policy named again is a repeat round: "picker #2"
        seen[name] += 1
        label = name if seen[name] == 1 else f"{name} #{seen[name]}"
        results.append(run_policy(config, name, trace, audio, adapters, args.work, label))
    write_report(config, results, trace, args.out, {})
    return 0


def _rounded(row: dict) -> dict:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}


def write_report(config, results, trace, out: Path, previous: dict) -> None:
    data = {
        **previous,
        "config": asdict(config),
        "summaries": [r.summary() for r in results],
        "outcomes": {r.policy: [_rounded(asdict(o)) for o in r.outcomes] for r in results},
        "timelines": {r.policy: r.views for r in results},
    }
    (out / "results.json").write_text(json.dumps(data, separators=(",", ":")))
    plot(results, out / "routing.png")
    (out / "table.md").write_text(report(config, results, trace, out) + "\n")
    print((out / "table.md").read_text())


if __name__ == "__main__":
    sys.exit(main())
