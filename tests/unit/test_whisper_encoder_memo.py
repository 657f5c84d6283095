"""The encoder memo's own logic: which inputs a step encodes, and the LRU within its budget.
(Its effect in a real engine, one encoder run per window with adapters on the encoder and
cross-attention, is shown end to end in tests/e2e/test_whisper_decoding.py.)"""

import torch

from lora_serving.vllm_plugin.whisper_encoder_memo import (
    EncoderMemo,
    memo_budget_bytes,
    plan_encoder_step,
)


def test_a_step_encodes_each_unknown_window_once():
    scheduled = {"probe-a": [0], "beam-a1": [0], "beam-a2": [0], "other": [0], "known": [0]}
    names = {"probe-a": "a", "beam-a1": "a", "beam-a2": "a", "other": "b", "known": "c"}
    to_encode, order = plan_encoder_step(scheduled, lambda req, _: names[req], known={"c"})
    assert to_encode == {"probe-a": [0], "other": [0]}
    assert order == ["a", "a", "a", "b", "c"]  # every input, in vLLM's order


def test_inputs_without_data_are_left_to_vllm():
    to_encode, order = plan_encoder_step({"r": [0, 1]}, lambda _, i: None if i else "x", set())
    assert to_encode == {"r": [0]} and order == ["x"]


def test_the_memo_drops_the_least_recently_used_within_its_budget():
    one = torch.zeros(256, dtype=torch.float32)  # 1 KiB
    memo = EncoderMemo(budget_bytes=3 * 1024)
    for key in "abc":
        memo.put(key, one.clone())
    assert memo.get("a") is not None  # a is now the most recently used
    memo.put("d", one.clone())
    assert memo.get("b") is None and {"a", "c", "d"} == set(memo.entries)
    memo.put("huge", torch.zeros(4096))  # larger than the whole budget: not kept
    assert "huge" not in memo.entries and memo.bytes <= memo.budget_bytes


def test_the_budget_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("LORA_SERVING_ENCODER_MEMO_MB", "0")
    assert memo_budget_bytes() == 0
    monkeypatch.delenv("LORA_SERVING_ENCODER_MEMO_MB")
    assert memo_budget_bytes() == 256 * 2**20
