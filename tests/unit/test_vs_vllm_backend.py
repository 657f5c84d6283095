"""The vllm_backend comparison's pure parts: loading edits and request conversion."""

import json

from lora_tools.bench import perf_data
from lora_tools.bench.vs_vllm_backend import apply_compat_edits, as_vllm_backend_entry


def test_compat_edits_apply_once_and_only_where_their_text_is():
    source = "from vllm.v1.metrics.loggers import StatLoggerBase, build_1_2_5_buckets\nx = 1\n"
    edited, applied = apply_compat_edits("utils/metrics.py", source)
    assert "from vllm.v1.metrics.buckets import build_1_2_5_buckets" in edited
    assert edited.endswith("x = 1\n") and len(applied) == 1 and "moved" in applied[0]
    assert apply_compat_edits("utils/metrics.py", edited) == (edited, [])
    assert apply_compat_edits("utils/request.py", source) == (source, [])  # not this file's edit


def test_entry_keeps_image_and_sampling_and_moves_the_adapter_into_sampling_parameters():
    data = perf_data.qwen_input_data(["alpha", None], images=2, max_tokens=16, stream=True)
    with_adapter, base = (as_vllm_backend_entry(e, "PROMPT") for e in data["data"])
    assert with_adapter["text_input"]["content"] == ["PROMPT"]
    assert with_adapter["image"] == data["data"][0]["image"]
    assert with_adapter["stream"]["content"] == [True]
    assert "lora_name" not in with_adapter
    sampling = json.loads(with_adapter["sampling_parameters"]["content"][0])
    assert sampling == {"max_tokens": 16, "ignore_eos": True, "lora_name": "alpha"}
    assert "lora_name" not in json.loads(base["sampling_parameters"]["content"][0])
