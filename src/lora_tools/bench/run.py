"""`make bench`: every figure of issue 7 in one run, written to results/bench-<time>/.

Per model (whisper, then qwen_vl), one tritonserver in explicit model-control mode:
  phase A  <model>_lora (many adapters, max_loras / max_cpu_loras from the config) and
           <model>_base (no LoRA) loaded together. Each round measures, in a rotating order:
             mixed   adapters b00..b03 round-robin on _lora    (P2 numerator)
             base    no adapter on _base                        (P2 denominator)
             nolora  no adapter on _lora                        (splits P2: LoRA layers vs deltas;
                                                                 P5 numerator for whisper)
             single  b00 only on _lora                          (P3 denominator)
             many    b00..b31 round-robin on _lora, each round  (P3 numerator)
                     starting where the last one stopped
             rtf     whisper only: nolora at p5_concurrency             (P5 numerator)
             hf      whisper only: transformers' pipeline on the same clips, at each of
                     hf_batch_sizes                                     (P5 denominator)
  phase B  _base unloaded; the same engine as _lora started in this process (AsyncLLM). First
           P6 (memory per adapter loaded into it), then each round, per concurrency, mixed
           through Triton and mixed in-process, alternating which goes first (P1, latency and
           time to first token per concurrency).
Every workload is warmed up first (one request per adapter, one token), so rounds measure the
steady state: adapters in the engine's cache, no first-call costs. A round is one repetition;
ratios are taken within a round and the report gives their median.

Then ("wer", wer.py): word error rate and time of whisper_lora (one tritonserver with only that
model) next to faster-whisper in its own environment, on the same espeak-ng sentences and
whisper-base weights, at whisper_lora's defaults and at beam 5.

Then ("speed", whisper_speed.py): P7, whisper_lora's audio seconds per second ÷ faster-whisper
int8's, on 54 short clips and on one long recording, whisper_lora served at float32 and bf16.

Then ("words", word_timing.py): word-start accuracy on espeak-ng words joined by known silences
(whisper_lora refined and not, faster-whisper word_timestamps=True) and whisper_lora's
throughput with word timings ÷ without.
"""

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import math
import os
import platform
import signal
import sys
import time
import traceback
from pathlib import Path

from lora_serving.dtype_choice import CPUINFO, cpu_flags, cpuinfo_field
from lora_serving.launcher import TritonServer
from lora_tools.bench import perf_data
from lora_tools.bench.config import BenchConfig, load_config
from lora_tools.bench.memory import LoadMeter, measure_adapter_memory
from lora_tools.bench.perf_analyzer import run_requests
from lora_tools.bench.processes import Isolation, engine_processes, free_port, own_pids
from lora_tools.bench.report import UNSTREAMED
from lora_tools.bench.repository import BenchModel, build
from lora_tools.bench.stats import summarize


class Log:
    """Progress lines to the console and bench.log; `quiet()` sends everything else this process
    and its engines print (vLLM, transformers) to driver.log instead of the console."""

    def __init__(self, path: Path):
        self.started = time.monotonic()
        self.handle = path.open("a")
        self.console = sys.stdout

    def quiet(self, path: Path) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.console = os.fdopen(os.dup(1), "w", buffering=1)
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, 1)
        os.dup2(target, 2)
        os.close(target)

    def __call__(self, message: str) -> None:
        line = f"[{time.monotonic() - self.started:7.1f} s] {message}"
        print(line, file=self.console, flush=True)
        self.handle.write(line + "\n")
        self.handle.flush()


def _without_stream(entry: dict) -> dict:
    return {name: tensor for name, tensor in entry.items() if name != "stream"}


def _retry(log, what: str, wait_s: float, action):
    """Run `action`; if it fails, say so, wait and run it once more."""
    try:
        return action()
    except Exception as err:
        log(
            f"   {what} failed ({str(err).strip().splitlines()[-1][:200]}); retrying in "
            f"{wait_s:.0f} s"
        )
        time.sleep(wait_s)
        return action()


class Bench:
    def __init__(self, config: BenchConfig, out: Path):
        self.config = config
        self.out = out
        self.work = config.results_dir / "work"
        self.log = Log(out / "bench.log")
        self.log.quiet(out / "driver.log")
        self.meter = LoadMeter(own_pids)
        self.isolation = Isolation(config.settle_s)
        self.results: dict = {
            "config": config.to_dict(),
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": machine_facts(),
            "models": {},
        }

    # ---- measurements --------------------------------------------------------------------
    def _record(self, store: list, meta: dict, records, failed: int, concurrency: int, load):
        summary = summarize(records, concurrency)
        entry = meta | {
            "summary": summary.to_dict(),
            "failed": failed,
            "other_load": load,
        }
        store.append(entry)
        self.log(
            f"    {meta['side']:9s} {meta['workload']:7s} c={concurrency:<3d} "
            f"{summary.throughput:7.3f} req/s  p50 {summary.latency_s[50] * 1e3:7.0f} ms  "
            f"ttft p50 {summary.ttft_s[50] * 1e3:6.0f} ms  others {load:.2f} cores"
            + (f"  FAILED {failed}" if failed else "")
        )
        return entry

    def triton(self, store, url, model, data: Path, concurrency, count, meta):
        self.isolation.only(model)
        self.meter.start()
        result = run_requests(
            model, data, grpc_url=url, concurrency=concurrency, request_count=count
        )
        load = self.meter.stop()
        meta = meta | {"side": "triton", "model": model, "concurrency": concurrency}
        meta["pa_throughput"] = result.reported_throughput
        return self._record(store, meta, result.records, result.failed, concurrency, load)

    def inprocess(self, store, engine, prepared, concurrency, count, meta):
        self.isolation.only(None)
        self.meter.start()
        records = engine.run(prepared, concurrency=concurrency, request_count=count)
        load = self.meter.stop()
        meta = meta | {"side": "inprocess", "concurrency": concurrency}
        return self._record(store, meta, records, 0, concurrency, load)

    # ---- one model -------------------------------------------------------------------------
    def workloads(self, model: BenchModel, folder: Path) -> dict[str, dict]:
        """Input data of each workload (and its one-token warm-up version)."""
        spec = self.config.model(model.kind)
        names = list(model.adapters)
        mixed = names[: self.config.mixed_adapters]
        clips = max(spec.requests_at(c) for c in spec.concurrencies)
        clips = max(clips, spec.phase_a_count, self.config.p5_requests)

        def make(adapters, items, max_tokens):
            if model.kind == "whisper":
                return perf_data.whisper_input_data(
                    adapters,
                    seconds=spec.clip_seconds,
                    clips=items,
                    max_tokens=max_tokens,
                    stream=True,
                    audio_format="wav",
                )
            return perf_data.qwen_input_data(
                adapters,
                image_size=tuple(spec.image_size),
                images=items,
                max_tokens=max_tokens,
                stream=True,
            )

        sets = {
            "mixed": mixed,
            "base": [None],
            "nolora": [None],
            "single": names[:1],
            "many": names,
        }
        data = {}
        for workload, adapters in sets.items():
            items = len(names) if workload == "many" else clips
            data[workload] = {
                "data": make(adapters, items, spec.max_tokens),
                "warm": make(adapters, len(adapters), 1),
            }
        if spec.p1_unstreamed:  # the sweep's requests, one response each
            sweep = data[spec.sweep_workload]
            data[UNSTREAMED] = {
                key: {"data": [_without_stream(e) for e in value["data"]]}
                for key, value in sweep.items()
            }
        return data

    def run_model(self, kind: str) -> None:
        config = self.config
        self.log(f"== {kind}: building the bench repository and adapters")
        t0 = time.monotonic()
        model = build(config, kind, self.work)
        # Registered before measuring, so a failure later keeps what was measured.
        result = self.results["models"].setdefault(kind, {})
        result.update(
            adapter_file_bytes=model.adapter_file_bytes,
            adapters_built_s=time.monotonic() - t0,
            measurements=[],
            hf=[],
        )
        folder = self.out / "data" / kind
        folder.mkdir(parents=True, exist_ok=True)
        workloads = self.workloads(model, folder)
        files = {}
        for name, sets in workloads.items():
            files[name] = perf_data.write(sets["data"], folder / f"{name}.json")
            files[f"{name}-warm"] = perf_data.write(sets["warm"], folder / f"{name}-warm.json")

        server = TritonServer(
            self.work / "repository",
            http=free_port(),
            grpc=free_port(),
            metrics=free_port(),
            extra_args=["--model-control-mode=explicit", "--log-verbose=0"],
            log_path=self.out / f"tritonserver-{kind}.log",
        )
        try:
            server.wait_ready(timeout_s=120)
            url = f"127.0.0.1:{server.grpc}"
            import tritonclient.grpc as grpcclient

            client = grpcclient.InferenceServerClient(url)
            self.log(f"   loading {model.lora_name} and {model.base_name} (two vLLM engines)")
            t0 = time.monotonic()

            def load(name):
                return _retry(
                    self.log,
                    f"loading {name}",
                    config.start_retry_wait_s,
                    lambda: client.load_model(name),
                )

            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                for loading in [
                    pool.submit(load, model.lora_name),
                    pool.submit(load, model.base_name),
                ]:
                    loading.result()
            result["triton_load_s"] = time.monotonic() - t0
            self.log(f"   loaded in {result['triton_load_s']:.0f} s")
            self.isolation.register(server.process.pid, [model.lora_name, model.base_name])
            hf = None
            if kind == "whisper":
                from lora_tools.bench.hf_whisper import HfWhisper, cores_in_bind

                env = json.loads(model.lora_model_json.read_text()).get("environment", {})
                threads = config.hf_threads or cores_in_bind(
                    env.get("VLLM_CPU_OMP_THREADS_BIND"), os.cpu_count() or 1
                )
                hf = HfWhisper(model.base_model_dir, device=config.hf_device, threads=threads)
                result["hf_threads"] = threads
            self.phase_a(model, url, files, workloads, result, hf)
            if config.profile:
                self.profile_phase_a(model, server, url, files, workloads, result, hf)
            del hf
            self.isolation.forget(model.base_name)
            client.unload_model(model.base_name)
            self._wait_unloaded(server, model.base_name)
            self.phase_b(model, server, url, files, workloads, result)
        finally:
            self.isolation.resume_all()
            server.stop()

    def _wait_unloaded(self, server, name: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not engine_processes(server.process.pid, f"{name}_0"):
                return
            time.sleep(1)
        self.log(f"   warning: {name} still has processes {timeout_s:.0f} s after unloading")

    def _clips(self, workload: dict, count: int):
        """The audio of the first `count` entries, as the server decodes it."""
        import base64
        import io

        import soundfile

        clips = []
        entries = workload["data"]["data"]
        for index in range(count):
            encoded = entries[index % len(entries)]["audio_file"]["content"][0]
            samples, _ = soundfile.read(io.BytesIO(base64.b64decode(encoded)), dtype="float32")
            clips.append(samples)
        return clips

    def phase_a(self, model, url, files, workloads, result, hf) -> None:
        config, spec = self.config, self.config.model(model.kind)
        c = spec.main_concurrency
        count = spec.phase_a_count
        runs = {
            "mixed": model.lora_name,
            "base": model.base_name,
            "nolora": model.lora_name,
            "single": model.lora_name,
            "many": model.lora_name,
        }
        self.log(f"   phase A warm-up: {', '.join(runs)}")
        for workload, target in runs.items():
            warm = workloads[workload]["warm"]
            self.isolation.only(target, settle=False)
            run_requests(
                target,
                files[f"{workload}-warm"],
                grpc_url=url,
                concurrency=c,
                request_count=max(len(warm["data"]), c),
            )
        clips = self._clips(workloads["nolora"], config.p5_requests) if hf else None
        if hf:
            self.isolation.only(None, settle=False)
            hf.transcribe(clips[:1], max_tokens=1, language="en", batch_size=1)
        order = list(runs) + (["rtf", *(f"hf{b}" for b in config.hf_batch_sizes)] if hf else [])
        many_entries = len(workloads["many"]["data"]["data"])
        for rep in range(config.repeats):
            shift = len(order) and rep % len(order)
            self.log(f"   phase A round {rep + 1}/{config.repeats} (c={c}, {count} requests)")
            for workload in order[shift:] + order[:shift]:
                meta = {"phase": "A", "rep": rep, "workload": workload}
                if workload.startswith("hf"):
                    batch = int(workload[2:])
                    self.isolation.only(None)
                    self.meter.start()
                    run = hf.transcribe(
                        clips, max_tokens=spec.max_tokens, language="en", batch_size=batch
                    )
                    load = self.meter.stop()
                    result["hf"].append(
                        meta
                        | {
                            "workload": "hf",
                            "batch_size": batch,
                            "audio_s": run.audio_s,
                            "wall_s": run.wall_s,
                            "rtf": run.rtf,
                            "clips": len(clips),
                            "other_load": load,
                        }
                    )
                    self.log(
                        f"    hf        batch {batch}: {len(clips)} clips {run.wall_s:5.1f} s  "
                        f"RTF {run.rtf:.2f}  others {load:.2f} cores"
                    )
                    continue
                if workload == "rtf":
                    self.triton(
                        result["measurements"],
                        url,
                        model.lora_name,
                        files["nolora"],
                        config.p5_concurrency,
                        config.p5_requests,
                        meta | {"workload": "nolora"},
                    )
                    continue
                data = files[workload]
                if workload == "many":  # each round goes on with the next adapters
                    data = perf_data.write(
                        perf_data.rotated(workloads["many"]["data"], rep * count % many_entries),
                        files["many"].with_name(f"many-round{rep}.json"),
                    )
                self.triton(result["measurements"], url, runs[workload], data, c, count, meta)

    def phase_b(self, model, server, url, files, workloads, result) -> None:
        from lora_tools.bench.inprocess import InProcessEngine

        config, spec = self.config, self.config.model(model.kind)
        self.log("   phase B: starting the same engine in-process (AsyncLLM)")
        engine = InProcessEngine(model.lora_model_json, model.task)

        def start():
            nonlocal engine
            try:
                return engine.start(config.server_start_timeout_s)
            except Exception:
                engine.close()
                engine = InProcessEngine(model.lora_model_json, model.task)
                raise

        try:
            result["inprocess_start_s"] = _retry(
                self.log, "starting the in-process engine", config.start_retry_wait_s, start
            )
            self.log(f"   in-process engine ready in {result['inprocess_start_s']:.0f} s")
            lora_requests = [a.to_lora_request() for a in engine.catalog]
            self.log("   P6: loading adapters into the in-process engine")
            result["p6"] = measure_adapter_memory(
                engine.add_loras,
                engine.process_ids,
                lora_requests,
                batches=config.p6_batches,
                batch_size=config.p6_batch_size,
                file_bytes=model.adapter_file_bytes,
            )
            for index, r in enumerate(result["p6"]["rounds"]):
                self.log(
                    f"    batch {index + 1}: {r['rss_per_adapter'] / 2**20:.2f} MiB RSS per "
                    f"adapter = {r['rss_ratio']:.2f} x file"
                )
            sweep = spec.sweep_workload
            prepared = engine.prepare(workloads[sweep]["data"])
            warm = engine.prepare(workloads[sweep]["warm"])
            engine.run(warm, concurrency=max(spec.concurrencies), request_count=len(warm))
            unstreamed = (
                engine.prepare(workloads[UNSTREAMED]["data"]) if spec.p1_unstreamed else None
            )
            points = [(sweep, c) for c in spec.concurrencies]
            if unstreamed is not None:
                points.append((UNSTREAMED, spec.main_concurrency))
            for rep in range(config.repeats):
                self.log(f"   phase B round {rep + 1}/{config.repeats}")
                for index, (workload, c) in enumerate(points):
                    count = spec.requests_at(c)
                    meta = {"phase": "B", "rep": rep, "workload": workload}
                    sides = ["triton", "inprocess"]
                    if (rep + index) % 2:
                        sides.reverse()
                    for side in sides:
                        if side == "triton":
                            self.triton(
                                result["measurements"],
                                url,
                                model.lora_name,
                                files[workload],
                                c,
                                count,
                                meta,
                            )
                        else:
                            requests = unstreamed if workload == UNSTREAMED else prepared
                            self.inprocess(result["measurements"], engine, requests, c, count, meta)
            if config.profile:
                self.profile_phase_b(model, server, url, files, engine, prepared, result, sweep)
        finally:
            engine.close()

    # ---- profiles of missed goals -----------------------------------------------------------
    def _profile(self, label: str, pids: dict[str, int], seconds: float, action) -> list[dict]:
        from lora_tools.bench.profiling import Recorder

        recorder = Recorder(pids, seconds, self.out / "profiles" / label)
        try:
            action()
        finally:
            summaries = recorder.finish()
        return [s.to_dict() | {"label": f"{label}: {s.label}"} for s in summaries]

    def _profile_count(self, model, workload_side: tuple, c: int, result) -> int:
        """Enough requests to keep the engine busy for profile_seconds."""
        from lora_tools.bench.report import median_throughput

        rate = median_throughput(result["measurements"], *workload_side, c)
        spec = self.config.model(model.kind)
        wanted = math.ceil(rate * self.config.profile_seconds * 1.2) if rate > 0 else 0
        return max(spec.phase_a_count, wanted)

    def profile_phase_a(self, model, server, url, files, workloads, result, hf) -> None:
        from lora_tools.bench.report import phase_a_ratios

        main_c = self.config.model(model.kind).main_concurrency
        missed = [  # the headline ratios; "(...)" marks ones reported beside them
            r
            for r in phase_a_ratios(model.kind, result, self.config)
            if r.met is False and "(" not in r.name
        ]
        if not missed:
            return
        profiles = result.setdefault("profiles", [])
        seconds = self.config.profile_seconds
        served = engine_processes(server.process.pid, f"{model.lora_name}_0")
        base = engine_processes(server.process.pid, f"{model.base_name}_0")
        for ratio in missed:
            self.log(f"   profiling {ratio.name} (missed: {ratio.value:.3f})")
            c = main_c
            if ratio.name.startswith("P2"):
                plan = [("mixed", model.lora_name, served), ("base", model.base_name, base)]
            elif ratio.name.startswith("P3"):
                plan = [("many", model.lora_name, served), ("single", model.lora_name, served)]
            elif ratio.name.startswith("P5"):
                plan = [("nolora", model.lora_name, served)]
                c = self.config.p5_concurrency
            else:
                continue
            for workload, target, pids in plan:
                count = self._profile_count(model, ("triton", workload), c, result)
                profiles += self._profile(
                    f"{ratio.name.split()[0]}-{workload}",
                    pids,
                    seconds,
                    lambda w=workload, t=target, n=count, cc=c: (
                        self.isolation.only(t, settle=False),
                        run_requests(t, files[w], grpc_url=url, concurrency=cc, request_count=n),
                    ),
                )
            if ratio.name.startswith("P5") and hf is not None:
                clips = self._clips(workloads["nolora"], max(2, math.ceil(seconds / 1.5)))
                spec = self.config.model(model.kind)
                profiles += self._profile(
                    "P5-hf",
                    {"hf_pipeline": os.getpid()},
                    seconds,
                    lambda clips=clips, spec=spec: self.isolation.only(None, settle=False)
                    or hf.transcribe(
                        clips,
                        max_tokens=spec.max_tokens,
                        language="en",
                        batch_size=self.config.hf_batch_sizes[0],
                    ),
                )

    def profile_phase_b(self, model, server, url, files, engine, prepared, result, sweep) -> None:
        from lora_tools.bench.report import p1_ratio

        c = self.config.model(model.kind).main_concurrency
        ratio = p1_ratio(model.kind, result, self.config)
        if ratio.met is not False:
            return
        self.log(f"   profiling {ratio.name} (missed: {ratio.value:.3f})")
        profiles = result.setdefault("profiles", [])
        seconds = self.config.profile_seconds
        count = self._profile_count(model, ("triton", sweep), c, result)
        profiles += self._profile(
            "P1-triton",
            engine_processes(server.process.pid, f"{model.lora_name}_0"),
            seconds,
            lambda: (
                self.isolation.only(model.lora_name, settle=False),
                run_requests(
                    model.lora_name, files[sweep], grpc_url=url, concurrency=c, request_count=count
                ),
            ),
        )
        count = self._profile_count(model, ("inprocess", sweep), c, result)
        profiles += self._profile(
            "P1-inprocess",
            engine_processes(os.getpid()),
            seconds,
            lambda: (
                self.isolation.only(None, settle=False),
                engine.run(prepared, concurrency=c, request_count=count),
            ),
        )

    # ---- word error rate vs faster-whisper ----------------------------------------------------
    def run_wer(self) -> None:
        from lora_tools.bench import wer

        self.log("== wer: whisper_lora vs faster-whisper, word error rate and time")
        self.results["wer"] = wer.measure(self.config, self.out, self.log, self.meter)

    def run_words(self) -> None:
        from lora_tools.bench import word_timing

        self.log("== words: word-timing accuracy vs faster-whisper, cost of word timings")
        self.results["words"] = word_timing.measure(self.config, self.out, self.log, self.meter)

    def run_speed(self) -> None:
        from lora_tools.bench import whisper_speed

        self.log("== speed: whisper_lora vs faster-whisper, audio seconds per second (P7)")
        self.results["speed"] = whisper_speed.measure(self.config, self.out, self.log, self.meter)

    # ---- whole run -------------------------------------------------------------------------
    def run(self) -> Path:
        from lora_tools.bench import report

        started = time.monotonic()
        for kind in self.config.models:
            try:
                if kind == "wer":
                    self.run_wer()
                elif kind == "speed":
                    self.run_speed()
                elif kind == "words":
                    self.run_words()
                else:
                    self.run_model(kind)
            except Exception as err:
                self.log(f"!! {kind} failed: {err!r}")
                failed = (
                    self.results if kind in ("wer", "speed", "words") else self.results["models"]
                )
                failed.setdefault(kind, {})["error"] = "".join(traceback.format_exception(err))
            self.results["total_s"] = time.monotonic() - started
            (self.out / "results.json").write_text(json.dumps(self.results, indent=1))
        self.results["total_s"] = time.monotonic() - started
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1))
        path = report.write_report(self.results, self.config, self.out)
        self.log(f"report: {path} (total {self.results['total_s'] / 60:.1f} min)")
        return path

    @property
    def failed(self) -> bool:
        parts = [
            *self.results["models"].values(),
            self.results.get("wer", {}),
            self.results.get("speed", {}),
            self.results.get("words", {}),
        ]
        return any("error" in result for result in parts)


def machine_facts() -> dict:
    import psutil

    memory = psutil.virtual_memory()
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(memory.total / 2**30, 1),
        "available_gib_at_start": round(memory.available / 2**30, 1),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        **cpu_facts(),
    }


# The CPU features that decide which kernels serve bf16 and int8 (AMX or not, AVX-512 BF16/VNNI).
CPU_FLAGS = ("amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni")


def cpu_facts(cpuinfo: Path = CPUINFO) -> dict:
    """The CPU's model name and which of CPU_FLAGS it has (empty where /proc/cpuinfo is not):
    this project's machines differ from run to run, and the figures with them."""
    model = cpuinfo_field("model name", cpuinfo)
    if not model:
        return {}
    flags = cpu_flags(cpuinfo)
    return {"cpu_model": model, "cpu_flags": [flag for flag in CPU_FLAGS if flag in flags]}


def _interrupt(*_):
    raise KeyboardInterrupt


def _parse_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Benchmarks of issue 7 (see docs/bench.md).")
    parser.add_argument("--config", type=Path, help="JSON file with bench settings")
    parser.add_argument(
        "--models",
        help="comma-separated parts to run: whisper,qwen_vl,wer,speed,words (default all; wer: "
        "word error rate vs faster-whisper, speed: P7 throughput vs faster-whisper, words: word "
        "timing accuracy and cost; minutes each)",
    )
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--whisper-concurrency", help="e.g. 1,2,4")
    parser.add_argument("--qwen-concurrency", help="e.g. 1,4,8")
    parser.add_argument("--no-profile", action="store_true", help="skip py-spy on missed goals")
    parser.add_argument("--results", type=Path, help="results folder (default results/)")
    parser.add_argument(
        "--report-only", type=Path, help="rewrite the report of an earlier run folder"
    )
    args = parser.parse_args(argv)
    overrides: dict = {}
    if args.models:
        overrides["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.repeats is not None:
        overrides["repeats"] = args.repeats
    if args.whisper_concurrency:
        overrides["whisper"] = {"concurrencies": _parse_list(args.whisper_concurrency)}
    if args.qwen_concurrency:
        overrides["qwen_vl"] = {"concurrencies": _parse_list(args.qwen_concurrency)}
    if args.no_profile:
        overrides["profile"] = False
    if args.results:
        overrides["results_dir"] = str(args.results.resolve())
    config = load_config(args.config, overrides)
    if args.report_only:
        from lora_tools.bench import report

        results = json.loads((args.report_only / "results.json").read_text())
        config = load_config(None, results["config"])
        print(report.write_report(results, config, args.report_only))
        return 0
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = config.results_dir / f"bench-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    latest = config.results_dir / "latest"
    with contextlib.suppress(OSError):
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(out.name)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops servers and engines as Ctrl-C does
    bench = Bench(config, out)
    bench.run()
    return 1 if bench.failed else 0


if __name__ == "__main__":
    sys.exit(main())
