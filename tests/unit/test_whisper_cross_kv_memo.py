"""The cross-attention K/V memo's own logic: when a layer runs kv_proj, what it keeps, and its
budget. (In a real engine, beam search equal to transformers with adapters on kv_proj and its
K/V reused by every beam step, see tests/e2e/test_whisper_decoding.py.)"""

import torch

from lora_serving.vllm_plugin.whisper_cross_kv_memo import (
    CrossKVMemo,
    Step,
    cross_kv,
    memo_budget_bytes,
)

ROWS, WIDTH = 6, 4


class CountingProjection:
    """kv_proj's interface (output, bias) over a fixed linear map, counting its calls."""

    def __init__(self):
        self.linear = torch.nn.Linear(WIDTH, 2 * WIDTH)
        self.calls = 0
        self.rows = 0

    def __call__(self, states):
        self.calls += 1
        self.rows += states.shape[0]
        with torch.no_grad():
            return self.linear(states), None


def windows(*names: str) -> dict[str, torch.Tensor]:
    return {name: torch.randn(ROWS, WIDTH) for name in names}


def step(memo: CrossKVMemo, audio: dict, keys: list[str], base_only: bool = False) -> tuple:
    states = torch.cat([audio[key] for key in keys])
    return Step(memo, keys, [ROWS] * len(keys), outputs=[], base_only=base_only), states


def test_a_window_seen_in_every_layer_is_not_projected_again():
    memo, proj, audio = CrossKVMemo(1 << 20), CountingProjection(), windows("a")
    first, states = step(memo, audio, ["a", "a"])  # probe and decode of one window
    expected = proj(states)[0]
    computed = [cross_kv(proj, states, first, layer) for layer in (0, 1)]
    assert proj.calls == 1 + 2
    beams, beam_states = step(memo, audio, ["a"] * 5)  # five beam requests of it
    for layer, kv in enumerate(computed):
        reused = cross_kv(proj, beam_states, beams, layer)
        assert proj.calls == 3, "a known window was projected again"
        assert torch.equal(reused, torch.cat([kv[:ROWS]] * 5))
    assert torch.allclose(computed[0], expected)
    assert (memo.runs, memo.reuses) == (2 * 2, 2 * 5)


def test_a_step_with_a_new_window_projects_all_its_rows_and_keeps_the_new_one():
    """kv_proj runs over every row of the step (the tower LoRA mapping covers them all)."""
    memo, proj, audio = CrossKVMemo(1 << 20), CountingProjection(), windows("a", "b")
    cross_kv(proj, *reversed(step(memo, audio, ["a"])), layer=0)
    mixed, states = step(memo, audio, ["a", "b"])
    kv = cross_kv(proj, states, mixed, layer=0)
    assert proj.calls == 2 and kv.shape == (2 * ROWS, 2 * WIDTH)
    assert torch.equal(memo.get("b", 0), kv[ROWS:])
    reused = cross_kv(proj, *reversed(step(memo, audio, ["b"])), layer=0)
    assert proj.calls == 2 and torch.equal(reused, kv[ROWS:])


def test_without_adapters_a_window_new_to_two_requests_of_a_step_is_projected_once():
    """A window's probe and decode in one step: with no adapter, kv_proj's base layer runs over
    each window's rows once; with adapters every row goes through kv_proj (one tower LoRA
    mapping entry per row)."""
    memo, proj, audio = CrossKVMemo(1 << 20), CountingProjection(), windows("a", "b")
    keys = ["a", "b", "a"]
    base, states = step(memo, audio, keys, base_only=True)
    kv = cross_kv(proj, states, base, layer=0)
    assert proj.rows == 2 * ROWS  # not 3
    assert torch.allclose(kv, proj.linear(states).detach(), atol=1e-6)
    assert (memo.runs, memo.reuses) == (2, 1)
    adapted, states = step(CrossKVMemo(1 << 20), audio, keys, base_only=False)
    proj.rows = 0
    cross_kv(proj, states, adapted, layer=0)
    assert proj.rows == 3 * ROWS


def test_a_reused_result_is_a_copy_the_attention_may_not_write_into_the_memo():
    memo, proj, audio = CrossKVMemo(1 << 20), CountingProjection(), windows("a")
    cross_kv(proj, *reversed(step(memo, audio, ["a"])), layer=0)
    reused = cross_kv(proj, *reversed(step(memo, audio, ["a"])), layer=0)
    reused.zero_()
    assert memo.get("a", 0).abs().sum() > 0


def test_rows_that_do_not_match_the_step_are_left_to_kv_proj():
    memo, proj, audio = CrossKVMemo(1 << 20), CountingProjection(), windows("a")
    noted, _ = step(memo, audio, ["a"])
    other = torch.randn(3 * ROWS, WIDTH)  # not this step's rows (a dummy run)
    assert torch.equal(cross_kv(proj, other, noted, layer=0), proj(other)[0])
    assert len(memo.windows) == 0
    assert torch.equal(cross_kv(proj, other, None, layer=0), proj(other)[0])


def test_the_memo_drops_whole_windows_least_recently_used_but_never_the_steps_own():
    kv = torch.zeros(256)  # 1 KiB
    memo = CrossKVMemo(budget_bytes=4 * 1024)
    for key in "ab":
        for layer in (0, 1):
            memo.put(key, layer, kv.clone(), keep={key})
    assert memo.get("a", 0) is not None  # a is now the most recently used
    memo.put("c", 0, kv.clone(), keep={"c"})
    assert "b" not in memo.windows and memo.bytes == 3 * 1024
    memo.put("c", 1, kv.clone(), keep={"c"})
    assert set(memo.windows) == {"a", "c"} and memo.bytes == 4 * 1024
    # Only the step's own windows left and still too big: the new layer is not kept.
    memo.put("d", 0, torch.zeros(1024 * 4), keep={"a", "c", "d"})
    assert "d" not in memo.windows and memo.bytes == 4 * 1024


def test_the_budget_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("LORA_SERVING_CROSS_KV_MEMO_MB", "0")
    assert memo_budget_bytes() == 0
    monkeypatch.delenv("LORA_SERVING_CROSS_KV_MEMO_MB")
    assert memo_budget_bytes() == 256 * 2**20
