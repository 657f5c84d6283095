"""Benchmark logic without servers or engines: input data, statistics, ratios, configuration,
the bench repository's model.json, perf_analyzer's profile export, profiles, the report."""

import base64
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from lora_tools.bench import perf_data
from lora_tools.bench.config import BenchConfig, load_config
from lora_tools.bench.hf_whisper import cores_in_bind
from lora_tools.bench.inprocess import raw_request
from lora_tools.bench.memory import MemorySample, growth_per_adapter
from lora_tools.bench.perf_analyzer import records_from_profile
from lora_tools.bench.profiling import summarize_collapsed
from lora_tools.bench.report import (
    all_ratios,
    latency_rows,
    load_summary,
    ratio_table,
    render_markdown,
)
from lora_tools.bench.repository import bench_model_json
from lora_tools.bench.stats import (
    Ratio,
    RequestRecord,
    Summary,
    paired_ratios,
    percentile,
    summarize,
)

# ---- statistics ------------------------------------------------------------------------------


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0]
    assert percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_percentile_refuses_nonsense():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_throughput_latency_and_ttft():
    records = [
        RequestRecord(start=0.0, first=0.1, end=1.0),
        RequestRecord(start=0.0, first=0.2, end=2.0),
        RequestRecord(start=1.0, first=1.5, end=4.0),
    ]
    summary = summarize(records, concurrency=2)
    assert summary.wall_s == 4.0
    assert summary.throughput == pytest.approx(3 / 4)
    assert summary.latency_s[50] == pytest.approx(2.0)
    assert summary.ttft_s[50] == pytest.approx(0.2)
    assert summary.ttft_s[99] == pytest.approx(np.percentile([0.1, 0.2, 0.5], 99))
    assert Summary.from_dict(json.loads(json.dumps(summary.to_dict()))) == summary


def test_summarize_needs_requests():
    with pytest.raises(ValueError):
        summarize([], concurrency=1)


def test_paired_ratios_and_goals():
    assert paired_ratios([2.0, 3.0, 4.0], [1.0, 0.0, 2.0]) == (2.0, 2.0)  # zero denominator out
    higher = Ratio("P2 x", (0.8, 0.95, 0.92), goal=0.9)
    assert higher.value == 0.92 and higher.met is True and higher.spread == (0.8, 0.95)
    lower = Ratio("P6 x", (1.3, 1.25, 1.1), goal=1.2, higher_is_better=False)
    assert lower.value == 1.25 and lower.met is False
    assert Ratio("P1 x", (), goal=0.95).met is None


# ---- input data --------------------------------------------------------------------------------


def test_whisper_wav_entries_carry_adapter_stream_and_equal_work():
    data = perf_data.whisper_input_data(
        ["b00", None], seconds=0.5, clips=3, max_tokens=7, stream=True, audio_format="wav"
    )
    entries = data["data"]
    assert len(entries) == 4  # rounded up: every adapter as often
    assert [perf_data.entry_adapter(e) for e in entries] == ["b00", None, "b00", None]
    import soundfile

    for index, entry in enumerate(entries):
        assert "audio" not in entry and entry["stream"]["content"] == [True]
        wav = base64.b64decode(entry["audio_file"]["content"][0])
        samples, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
        assert rate == 16_000 and samples.size == 8_000
        expected = perf_data.speech_like_audio(0.5, seed=index)
        assert np.abs(samples - expected).max() < 1e-3  # 16-bit quantisation only
        sampling = json.loads(entry["sampling_parameters"]["content"][0])
        assert sampling == {"max_tokens": 7, "ignore_eos": True}


def test_whisper_samples_format_is_unchanged_by_default():
    entry = perf_data.whisper_input_data([None], seconds=0.1, clips=1)["data"][0]
    assert entry["audio"]["shape"] == [1600] and "stream" not in entry
    with pytest.raises(ValueError):
        perf_data.whisper_input_data([None], audio_format="mp3")


def test_qwen_entries_and_rotation():
    data = perf_data.qwen_input_data(["a", "b", "c"], image_size=(8, 8), images=3, stream=True)
    assert [perf_data.entry_adapter(e) for e in data["data"]] == ["a", "b", "c"]
    rotated = perf_data.rotated(data, 4)
    assert [perf_data.entry_adapter(e) for e in rotated["data"]] == ["b", "c", "a"]
    assert perf_data.rotated({"data": []}, 3) == {"data": []}


def test_adapter_names():
    assert perf_data.adapter_names(3) == ["b00", "b01", "b02"]
    assert perf_data.adapter_names(101)[-1] == "b100"


def test_entries_become_the_tensors_triton_would_hand_the_model():
    entry = perf_data.whisper_input_data(["b01"], seconds=0.1, clips=1, stream=True)["data"][0]
    raw = raw_request(entry)
    assert raw.batch_size == 1
    assert raw.tensors["audio"].dtype == np.float32 and raw.tensors["audio"].shape == (1, 1600)
    assert raw.tensors["sample_rate"].dtype == np.int32
    assert raw.boolean("stream", 0, default=False) is True
    assert raw.string("lora_name", 0) == "b01"
    assert json.loads(raw.string("sampling_parameters", 0))["ignore_eos"] is True


# ---- perf_analyzer profile export ------------------------------------------------------------


def test_records_from_profile_export():
    export = {
        "experiments": [
            {
                "experiment": {"mode": "concurrency", "value": 2},
                "requests": [
                    {"timestamp": 1_000_000_000, "response_timestamps": [1_200_000_000, 2e9]},
                    {"timestamp": 1_500_000_000, "response_timestamps": [3_000_000_000]},
                    {"timestamp": 1_600_000_000, "response_timestamps": []},
                ],
            }
        ]
    }
    records, failed = records_from_profile(export)
    assert failed == 1
    assert records[0] == RequestRecord(1.0, 1.2, 2.0, 2)
    assert records[1].ttft == records[1].latency == pytest.approx(1.5)


# ---- configuration -----------------------------------------------------------------------------


def test_config_defaults_are_consistent():
    config = load_config()
    assert config.check() == []
    assert config.repeats >= 3
    assert config.whisper.sweep_workload == "nolora"
    assert config.whisper.phase_a_count == 4
    assert config.qwen_vl.phase_a_count == 64 and config.qwen_vl.p1_unstreamed


def test_config_file_and_overrides_merge(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(
        json.dumps(
            {
                "engine_overrides": {"dtype": "bfloat16", "mm_processor_cache_gb": None},
                "whisper": {"concurrencies": [1, 32], "sweep_workload": "mixed"},
                "results_dir": "elsewhere",
            }
        )
    )
    config = load_config(path, {"repeats": 5})
    assert config.engine_overrides == {"dtype": "bfloat16"}  # null removed the default
    assert config.whisper.concurrencies == [1, 32] and config.whisper.main_concurrency == 2
    assert config.repeats == 5
    assert config.results_dir.is_absolute() and config.results_dir.name == "elsewhere"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"models": ["bert"]}, "unknown models"),
        ({"max_cpu_loras": 8}, "max_cpu_loras"),
        ({"whisper": {"sweep_workload": "many"}}, "sweep_workload"),
        ({"nonsense": 1}, "unknown bench setting"),
    ],
)
def test_config_problems_are_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, overrides)


def test_config_round_trips_through_results_json():
    config = BenchConfig()
    again = load_config(None, json.loads(json.dumps(config.to_dict())))
    assert again.to_dict() == config.to_dict()


# ---- bench repository --------------------------------------------------------------------------

SHIPPED = {
    "model": "../../../demo_models/whisper-base",
    "dtype": "float32",
    "enable_lora": True,
    "enable_tower_connector_lora": True,
    "max_loras": 4,
    "max_lora_rank": 16,
    "max_cpu_loras": 8,
    "environment": {"VLLM_CPU_OMP_THREADS_BIND": "0"},
    "serving": {
        "adapters": {"roots": ["../../../adapters/whisper_lora"], "control": "full"},
        "default_max_tokens": 224,
    },
}


def test_bench_model_json_lora_and_base(tmp_path):
    model_dir = tmp_path / "demo_models" / "whisper-base"
    model_dir.mkdir(parents=True)
    shipped_dir = tmp_path / "repo" / "whisper_lora" / "1"
    shipped_dir.mkdir(parents=True)
    common = dict(
        max_loras=4,
        max_cpu_loras=32,
        engine_overrides={"mm_processor_cache_gb": 0},
        environment_overrides={"VLLM_CPU_KVCACHE_SPACE": "2"},
    )
    lora = bench_model_json(SHIPPED, shipped_dir, lora=True, **common)
    assert lora["model"] == str(model_dir.resolve())
    assert lora["max_cpu_loras"] == 32 and lora["enable_tower_connector_lora"] is True
    assert lora["serving"]["adapters"] == {"control": "full"}  # the fleet's folders left out
    assert lora["serving"]["multi_lora_file"] == "multi_lora.json"
    assert lora["mm_processor_cache_gb"] == 0
    assert lora["environment"] == {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
    base = bench_model_json(SHIPPED, shipped_dir, lora=False, **common)
    assert not any("lora" in key for key in base)
    assert "adapters" not in base["serving"] and base["serving"]["default_max_tokens"] == 224
    assert SHIPPED["serving"]["adapters"]["roots"]  # the shipped dict is left alone


# ---- memory, cores, profiles -------------------------------------------------------------------


def test_growth_per_adapter():
    growth = growth_per_adapter(
        MemorySample(100, 50), MemorySample(100 + 8 * 110, 50 + 8 * 100), 8, 100
    )
    assert growth["rss_per_adapter"] == 110 and growth["rss_ratio"] == pytest.approx(1.1)
    assert growth["uss_ratio"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        growth_per_adapter(MemorySample(0, 0), MemorySample(0, 0), 0, 100)


@pytest.mark.parametrize(
    "bind, cores", [("0", 1), ("0-3", 4), ("0,2,4-5", 4), ("auto", 8), ("", 8), ("0-1|2-3", 2)]
)
def test_cores_in_bind(bind, cores):
    assert cores_in_bind(bind, available=8) == cores


def test_profile_summary_separates_waiting_from_work():
    site = "/x/.venv/lib/python3.11/site-packages"
    text = "\n".join(
        [
            f"run (threading.py:1);busy_loop ({site}/vllm/v1/engine/core.py:10);"
            f"sched_yield ({site}/vllm/distributed/utils.py:46) 60",
            f"run (threading.py:1);execute_model ({site}/vllm/v1/worker/gpu_model_runner.py:5);"
            f"_lora_product (/w/src/lora_serving/vllm_plugin/cpu_no_lora_index.py:41) 30",
            f"run (threading.py:1);execute_model ({site}/vllm/v1/worker/gpu_model_runner.py:5);"
            f"forward ({site}/vllm/model_executor/models/whisper.py:7) 10",
        ]
    )
    summary = summarize_collapsed("worker", text)
    assert summary.samples == 100 and summary.waiting == pytest.approx(0.6)
    assert summary.top_frames[0] == (
        "_lora_product (lora_serving/vllm_plugin/cpu_no_lora_index.py:41)",
        pytest.approx(0.3),
    )
    inclusive = dict(summary.top_inclusive)
    assert "execute_model (vllm/v1/worker/gpu_model_runner.py)" not in inclusive  # on all stacks
    assert inclusive["_lora_product (lora_serving/vllm_plugin/cpu_no_lora_index.py)"] == 0.3


def test_a_queue_reader_asleep_in_zmq_is_waiting():
    """With cpu_no_spin, vLLM's queue readers wait in zmq's Poller.poll (woken every 1 ms while
    messages flow, so py-spy samples them as active): waiting, not work."""
    site = "/x/.venv/lib/python3.11/site-packages"
    text = "\n".join(
        [
            f"run (threading.py:1);dequeue ({site}/vllm/v1/executor/multiproc_executor.py:98);"
            f"wait ({site}/lora_serving/vllm_plugin/cpu_no_spin.py:55);"
            f"Poller.poll ({site}/zmq/sugar/poll.py:106) 40",
            f"run (threading.py:1);step ({site}/vllm/v1/engine/core.py:671);"
            f"schedule ({site}/vllm/v1/core/sched/scheduler.py:300) 60",
        ]
    )
    summary = summarize_collapsed("engine_core", text)
    assert summary.waiting == pytest.approx(0.4)
    assert all("Poller.poll" not in frame for frame, _ in summary.top_frames)


# ---- report ------------------------------------------------------------------------------------


def _measurement(phase, rep, side, workload, c, throughput, load=0.0):
    summary = Summary(
        requests=8,
        concurrency=c,
        wall_s=8 / throughput,
        throughput=throughput,
        latency_s={50: 1.0, 90: 1.5, 99: 2.0},
        ttft_s={50: 0.1, 90: 0.2, 99: 0.3},
    )
    return {
        "phase": phase,
        "rep": rep,
        "side": side,
        "workload": workload,
        "concurrency": c,
        "summary": summary.to_dict(),
        "other_load": load,
    }


def _results(config: BenchConfig) -> dict:
    c = config.whisper.main_concurrency
    ms = []
    for rep in range(3):
        ms += [
            _measurement("A", rep, "triton", "mixed", c, 0.9 + 0.01 * rep),
            _measurement("A", rep, "triton", "base", c, 1.0),
            _measurement("A", rep, "triton", "nolora", c, 0.98 - 0.01 * rep),
            _measurement("A", rep, "triton", "single", c, 0.9),
            _measurement("A", rep, "triton", "many", c, 0.45, load=0.5 * rep),
            _measurement("A", rep, "triton", "nolora", config.p5_concurrency, 1.2),
            _measurement("B", rep, "triton", "nolora", c, 0.97),
            _measurement("B", rep, "inprocess", "nolora", c, 1.0),
            _measurement("B", rep, "triton", "nolora", 2 * c, 1.5),  # another concurrency
            _measurement("B", rep, "inprocess", "nolora", 2 * c, 1.5),
        ]
    return {
        "started": "2026-01-01T00:00:00",
        "total_s": 600,
        "machine": {"cpus": 2, "memory_gib": 23.5, "available_gib_at_start": 8},
        "models": {
            "whisper": {
                "measurements": ms,
                "hf": [
                    {"rep": r, "batch_size": b, "rtf": rtf, "other_load": 0.0}
                    for r in range(3)
                    for b, rtf in ((1, 2.0), (4, 3.0))
                ],
                "p6": {
                    "file_bytes": 2 * 2**20,
                    "batch_size": 8,
                    "rounds": [
                        {
                            "rss_ratio": x,
                            "uss_ratio": x,
                            "rss_per_adapter": x * 2**21,
                            "uss_per_adapter": x * 2**21,
                        }
                        for x in (1.0, 1.05, 1.01)
                    ],
                },
                "profiles": [
                    {
                        "label": "P3-many: worker",
                        "samples": 10,
                        "waiting": 0.1,
                        "top_frames": [["f (x.py:1)", 0.9]],
                        "top_inclusive": [["g (y.py)", 0.5]],
                    }
                ],
            },
            "qwen_vl": {"error": "Traceback ...\nRuntimeError: boom"},
        },
    }


def test_ratios_are_paired_by_round_and_checked_against_goals():
    config = BenchConfig()
    ratios = {
        r.name.split()[0]: r for r in all_ratios(_results(config), config) if "(" not in r.name
    }
    assert ratios["P1"].value == pytest.approx(0.97) and ratios["P1"].met is True
    assert ratios["P2"].value == pytest.approx(0.91) and ratios["P2"].met is False  # goal 0.95
    # no adapter on the LoRA engine ÷ LoRA off: 0.98, 0.97, 0.96 -> 0.97, under its goal 0.98
    assert ratios["P2-none"].value == pytest.approx(0.97) and ratios["P2-none"].met is False
    assert ratios["P3"].value == pytest.approx(0.5) and ratios["P3"].met is False
    # P5: served RTF = 1.2 req/s at p5_concurrency * 5 s clips = 6; pipeline batch 1: RTF 2
    assert ratios["P5"].value == pytest.approx(3.0) and ratios["P5"].met is True
    assert ratios["P6"].value == pytest.approx(1.01) and ratios["P6"].met is True
    assert list(ratios) == ["P1", "P2", "P2-none", "P3", "P5", "P6"]
    beside = [r for r in all_ratios(_results(config), config) if "pipeline batch 4" in r.name]
    assert beside[0].value == pytest.approx(2.0)


def test_report_markdown_has_every_figure(tmp_path):
    config = BenchConfig()
    results = _results(config)
    text = render_markdown(results, config, plots=[str(tmp_path / "ratios_vs_goals.png")])
    assert "| P3 whisper_lora: 32 adapters ÷ 1 adapter" in text
    assert "| 0.500 | 3 (0.500 – 0.500) | ≥ 0.8 | **no** |" in text
    assert "The machine was busy" in text  # one round of `many` ran beside 1 busy core
    assert "whisper_lora 6.00 at concurrency 4 (no adapter)" in text
    assert "transformers pipeline batch size 1: 2.00; batch size 4: 3.00" in text
    assert "RuntimeError: boom" in text  # a failed model is reported, not dropped
    assert "Profile P3-many: worker: 10 samples, 10% waiting" in text
    assert "![ratios_vs_goals](ratios_vs_goals.png)" in text
    rows = latency_rows(results["models"]["whisper"], "nolora")
    assert [(r["concurrency"], r["side"]) for r in rows] == [
        (2, "inprocess"),
        (2, "triton"),
        (4, "inprocess"),
        (4, "triton"),
    ]
    assert rows[0]["ttft_p99"] == pytest.approx(0.3) and rows[0]["rounds"] == 3


def test_load_summary_and_ratio_table_formatting():
    load = load_summary(
        {"models": {"m": {"measurements": [{"other_load": 0.1}, {"other_load": 1.0}]}}}
    )
    assert load["max"] == 1.0 and load["busy_share"] == 0.5
    assert math.isnan(load_summary({"models": {}})["median"])
    lines = ratio_table([Ratio("P6 qwen_vl_lora", (1.0, 1.1, 1.3), 1.2, higher_is_better=False)])
    assert lines[-1].endswith("| 1.100 | 3 (1.000 – 1.300) | ≤ 1.2 | yes |")


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    from lora_tools.bench.report import write_report

    config = BenchConfig()
    path = write_report(_results(config), config, tmp_path)
    assert path.read_text().startswith("# Benchmark report")
    for name in ("throughput_vs_concurrency", "latency_percentiles", "ratios_vs_goals"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    assert Path(path).parent == tmp_path


CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
"""


def test_report_names_the_cpu_and_its_bf16_int8_features(tmp_path):
    from lora_tools.bench.run import cpu_facts

    xeon, epyc = tmp_path / "xeon", tmp_path / "epyc"
    xeon.write_text(CPUINFO)
    epyc.write_text("model name\t: AMD EPYC 9R14\nflags\t\t: fpu avx512_bf16 avx512_vnni\n")
    facts = cpu_facts(xeon)
    assert facts == {
        "cpu_model": "Intel(R) Xeon(R) Processor",
        "cpu_flags": ["amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni"],
    }
    no_amx = cpu_facts(epyc)
    assert no_amx["cpu_flags"] == ["avx512_bf16", "avx512_vnni"]
    assert cpu_facts(tmp_path / "missing") == {}
    config = BenchConfig()
    text = render_markdown({"models": {}, "machine": {"cpus": 2, **facts}}, config, [])
    assert (
        "2 CPUs (Intel(R) Xeon(R) Processor; amx_bf16, amx_int8, avx512_bf16, avx512_vnni)" in text
    )
    plain = render_markdown({"models": {}, "machine": {"cpus": 2}}, config, [])
    assert "2 CPUs, " in plain
