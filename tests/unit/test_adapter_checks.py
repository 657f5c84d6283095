"""Base-model fit (declared name, module shapes), adapter options in model.json, command
parsing, and the metric helpers: pure functions, exact results and messages."""

import json
from pathlib import Path

import pytest

from lora_serving.adapters.catalog import load_adapter, weight_shapes
from lora_serving.adapters.checks import BaseModel, canonical_module, max_tensor_rank
from lora_serving.adapters.control import parse_command
from lora_serving.errors import ConfigError, InvalidRequest
from lora_serving.metrics import BASE_LABEL, JobMeter
from lora_serving.settings import AdapterOptions, EngineSettings
from tests.unit.adapter_factory import make_adapter, make_base

DEMO_CASES = [
    # (served base, adapter folder, fits)
    ("qwen2-vl-tiny", "qwen2-vl-adapters/alpha", True),
    ("qwen2_5-vl-tiny", "qwen2_5-vl-adapters/beta", True),
    ("whisper-base", "whisper-adapters/all_layers", True),
    ("qwen2-vl-tiny", "qwen2_5-vl-adapters/alpha", False),
    ("qwen2-vl-tiny", "whisper-adapters/alpha", False),
]


@pytest.mark.parametrize(
    "path, canonical",
    [
        ("base_model.model.model.language_model.layers.0.mlp.fc1", "layers.0.mlp.fc1"),
        ("model.layers.0.mlp.fc1", "layers.0.mlp.fc1"),
        ("base_model.model.model.visual.blocks.0.attn.qkv", "visual.blocks.0.attn.qkv"),
        ("visual.merger.mlp.0", "visual.merger.mlp.0"),
        ("base_model.model.model.encoder.layers.1.fc2", "encoder.layers.1.fc2"),
    ],
)
def test_canonical_module_names_match_across_transformers_layouts(path, canonical):
    assert canonical_module(path) == canonical


@pytest.mark.parametrize("base, adapter, fits", DEMO_CASES)
def test_demo_adapters_against_demo_models(demo_models, base, adapter, fits, tmp_path):
    folder = demo_models / adapter
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = None  # shapes alone
    shapes = weight_shapes(folder / "adapter_model.safetensors")
    problems = BaseModel.from_folder(demo_models / base).problems(config, shapes)
    assert (problems == []) == fits, problems


def test_declared_base_model_name(tmp_path):
    base = BaseModel.from_folder(make_base(tmp_path / "Qwen2-VL-2B", name_or_path="org/the-model"))
    for accepted in ("Qwen/Qwen2-VL-2B", str(tmp_path / "Qwen2-VL-2B"), "org/The-Model", ""):
        assert base.problems({"base_model_name_or_path": accepted}, {}) == [], accepted
    [problem] = base.problems({"base_model_name_or_path": "Qwen/Qwen2-VL-7B"}, {})
    assert problem.startswith("trained for base model 'Qwen/Qwen2-VL-7B', but this model serves")
    assert "serving.adapters.base_model_names" in problem
    aliased = BaseModel.from_folder(tmp_path / "Qwen2-VL-2B", extra_names=("Qwen2-VL-7B",))
    assert aliased.problems({"base_model_name_or_path": "Qwen/Qwen2-VL-7B"}, {}) == []


def test_shape_messages_name_the_modules(tmp_path):
    base = make_base(tmp_path / "base")
    adapter = make_adapter(
        tmp_path / "a",
        modules={"model.layers.0.mlp.fc1": (8, 5), "model.layers.9.mlp.fc1": (8, 4)},
    )
    with pytest.raises(ConfigError) as err:
        load_adapter("a", adapter, 1, max_lora_rank=8, base_model=BaseModel.from_folder(base))
    text = str(err.value)
    assert "1 module(s) do not exist in base model 'base': model.language_model.layers.9" in text
    assert (
        "1 module(s) do not fit base model 'base': model.language_model.layers.0.mlp.fc1: "
        "lora_A [4, 5] / lora_B [8, 4] vs base weight [8, 4]"
    ) in text


def test_rank_pattern_over_the_limit_is_refused(tmp_path):
    adapter = make_adapter(tmp_path / "a", rank=16, config={"r": 8, "rank_pattern": {"fc1": 16}})
    with pytest.raises(ConfigError, match=r"a module has rank 16 \(rank_pattern\), over max_lora"):
        load_adapter("a", adapter, 1, max_lora_rank=8)
    assert max_tensor_rank({"m.lora_A.weight": (16, 4), "n.lora_A.default.weight": (2, 4)}) == 16


def test_truncated_weights_are_refused_not_raised(tmp_path):
    adapter = make_adapter(tmp_path / "a")
    weights = adapter / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(ConfigError, match="not a readable safetensors file"):
        load_adapter("a", adapter, 1, max_lora_rank=8)


# ---- model.json serving.adapters -----------------------------------------------------------------
def test_adapter_options_are_read_relative_to_model_json(tmp_path):
    options, problems = AdapterOptions.from_dict(
        {"roots": ["../adapters", "/abs/root"], "rescan_interval_s": 2, "control": "full"},
        model_dir=tmp_path / "1",
    )
    assert problems == []
    assert options.roots == ((tmp_path / "adapters").resolve(), Path("/abs/root"))
    assert (options.rescan_interval_s, options.control) == (2.0, "full")
    defaults, _ = AdapterOptions.from_dict({}, model_dir=tmp_path)
    assert (defaults.roots, defaults.rescan_interval_s, defaults.control) == ((), 30.0, "list")


def test_adapter_options_and_limits_list_every_problem(tmp_path):
    with pytest.raises(ConfigError) as err:
        EngineSettings.from_dict(
            {
                "model": "m",
                "enable_lora": True,
                "max_loras": 8,
                "max_cpu_loras": 4,
                "serving": {
                    "adapters": {
                        "roots": "not-a-list",
                        "rescan_interval_s": -1,
                        "control": "root",
                        "extra": 1,
                    }
                },
            },
            model_dir=tmp_path,
        )
    text = str(err.value)
    assert "serving.adapters.roots must be a list of non-empty strings" in text
    assert "serving.adapters.rescan_interval_s must be >= 0, got -1" in text
    assert "serving.adapters.control must be one of off, list, full, got 'root'" in text
    assert "unknown 'serving.adapters' key 'extra'" in text
    assert "max_cpu_loras (4) must be >= max_loras (8)" in text


def test_lora_defaults_many_adapters_per_batch_and_no_remote_code(tmp_path):
    settings = EngineSettings.from_dict({"model": "m", "enable_lora": True}, model_dir=tmp_path)
    assert settings.engine_args["max_loras"] == 4 and settings.max_cpu_loras == 4
    assert settings.engine_args["trust_remote_code"] is False
    kept = EngineSettings.from_dict({"model": "m", "trust_remote_code": True}, model_dir=tmp_path)
    assert kept.engine_args["trust_remote_code"] is True


# ---- adapter_command parsing -------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, control, verb, args",
    [
        ("list", "list", "list", ()),
        ("  RESCAN ", "list", "rescan", ()),
        ("load a", "full", "load", ("a",)),
        ('load a "my dir/a"', "full", "load", ("a", "my dir/a")),
        ("unload a", "full", "unload", ("a",)),
    ],
)
def test_commands_parse(text, control, verb, args):
    command = parse_command(text, control=control)
    assert (command.verb, command.args) == (verb, args)


@pytest.mark.parametrize(
    "text, control, message",
    [
        ("list", "off", "adapter commands are off for this model"),
        ("load a b", "list", "'load' needs serving.adapters.control \"full\""),
        ("unload a", "list", "'unload' needs serving.adapters.control \"full\""),
        ("", "full", "adapter_command is empty; use: list | rescan"),
        ("drop a", "full", "unknown adapter_command 'drop'"),
        ("load", "full", "'load' takes 1 to 2 arguments"),
        ("unload a b", "full", "'unload' takes 1 argument(s)"),
        ("list all", "full", "'list' takes no arguments"),
        ('load "a', "full", "No closing quotation"),
    ],
)
def test_bad_or_forbidden_commands_are_refused(text, control, message):
    with pytest.raises(InvalidRequest) as err:
        parse_command(text, control=control)
    assert message in str(err.value)


def test_changes_need_the_control_token_and_listing_without_it_shows_names_only(tmp_path):
    import asyncio

    from lora_serving.adapters.control import ControlToken, run_command
    from lora_serving.settings import AdapterOptions

    options, problems = AdapterOptions.from_dict(
        {"control": "full", "control_token_env": "TOKEN_VAR"}, model_dir=tmp_path
    )
    assert options.control_token_env == "TOKEN_VAR" and not problems
    _, problems = AdapterOptions.from_dict({"control_token_env": "a b"}, model_dir=tmp_path)
    assert problems == ["serving.adapters.control_token_env must be an environment variable's name"]

    token = ControlToken.from_environment("TOKEN_VAR", {"TOKEN_VAR": "s3cret"})
    assert parse_command("load a", control="full", token=token, presented="s3cret").authorized
    for presented in (None, "", "wrong", 7):
        with pytest.raises(InvalidRequest, match="needs this model's control token"):
            parse_command("unload a", control="full", token=token, presented=presented)
    unset = ControlToken.from_environment("TOKEN_VAR", {})  # named but empty: no change at all
    with pytest.raises(InvalidRequest, match="control token"):
        parse_command("load a", control="full", token=unset, presented="")
    assert parse_command("load a", control="full").authorized  # no token configured: as before

    class Fleet:
        enabled = True

        async def describe(self):
            return {"adapters": [{"name": "a", "path": "/srv/a"}], "roots": ["/srv"]}

        async def rescan(self):
            from lora_serving.adapters.fleet import ScanReport

            return ScanReport(added=["a"], refused={"b": "/srv/b: pickle"}, problems=["/srv/c"])

    anonymous = parse_command("list", control="full", token=token)
    assert not anonymous.authorized
    assert asyncio.run(run_command(Fleet(), anonymous)) == {"adapters": [{"name": "a"}]}
    owner = parse_command("list", control="full", token=token, presented="s3cret")
    assert asyncio.run(run_command(Fleet(), owner))["roots"] == ["/srv"]
    rescan = asyncio.run(run_command(Fleet(), parse_command("rescan", control="full", token=token)))
    assert rescan["added"] == ["a"] and "/srv" not in json.dumps(rescan)


# ---- metric helpers ----------------------------------------------------------------------------
def test_scheduler_counts_by_adapter_name_and_base_remainder():
    from lora_serving.engine.stat_logger import scheduler_load

    load = scheduler_load(5, 2, {"a@1": 2, "a@7": 1, "b@2": 1}, {"b@2": 2})
    assert load.running == {"a": 3, "b": 1, BASE_LABEL: 1}
    assert load.waiting == {"b": 2, BASE_LABEL: 0}
    assert (load.kv_cache_usage, load.max_loras) == (0.0, 0)


def test_scheduler_load_logger_reports_waiting_kv_usage_and_slots_as_vllm_counts_them():
    from types import SimpleNamespace

    from vllm.v1.metrics.stats import SchedulerStats

    from lora_serving.engine.stat_logger import SchedulerLoadLogger

    events = []
    sink = SimpleNamespace(record=events.append)
    config = SimpleNamespace(lora_config=SimpleNamespace(max_loras=4))
    logger = SchedulerLoadLogger(config, sink=sink)
    logger.log_engine_initialized()  # an idle engine's slots are known before any request
    assert events[-1].max_loras == 4 and events[-1].running == {BASE_LABEL: 0}
    stats = SchedulerStats(
        num_running_reqs=2,
        num_waiting_reqs=1,
        num_skipped_waiting_reqs=2,  # deferred: vllm:num_requests_waiting counts them too
        kv_cache_usage=0.123456,
        running_lora_adapters={"a@1": 2},
        waiting_lora_adapters={"a@1": 0, "b@2": 3},
    )
    logger.record(stats, None)
    logger.record(stats, None)  # unchanged: not sent again
    assert len(events) == 2
    load = events[-1]
    assert load.running == {"a": 2, BASE_LABEL: 0}
    assert load.waiting == {"a": 0, "b": 3, BASE_LABEL: 0}
    assert (load.kv_cache_usage, load.max_loras) == (0.123, 4)  # in steps of 0.1 %
    no_lora = SchedulerLoadLogger(SimpleNamespace(lora_config=None), sink=sink)
    no_lora.record(stats, None)
    assert events[-1].max_loras == 0


def test_job_meter_counts_every_engine_request_and_first_output_token():
    meter = JobMeter(adapter="a", started=100.0)
    meter.engine_request_done(
        submitted=100.0, prompt_tokens=10, generation_tokens=1, first_token_s=None
    )  # language detection: not the job's first token
    meter.engine_request_done(
        submitted=100.5, prompt_tokens=12, generation_tokens=20, first_token_s=0.25
    )
    meter.engine_request_done(
        submitted=102.0, prompt_tokens=12, generation_tokens=5, first_token_s=0.1
    )
    assert meter.first_token_at == 100.75
    event = meter.finished("success")
    assert (event.prompt_tokens, event.generation_tokens) == (34, 26)
    assert event.adapter == "a" and event.outcome == "success"
