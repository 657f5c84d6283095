"""Our vLLM general plugin: the CPU mixed-batch LoRA fix (defect 1) and its start-up guards.

Regression test for vLLM 0.32's torch LoRA ops giving a request without an adapter (index -1)
the last slot's delta (upstream PRs 48421, 49656). No engine: the ops and the CPU punica wrapper
are called directly.
"""

import importlib
import logging
import re
from pathlib import Path

import pytest
import torch
import vllm.version
from vllm.lora.layers import LoRAMapping
from vllm.lora.punica_wrapper import punica_cpu
from vllm.lora.punica_wrapper.utils import compute_meta
from vllm.platforms import current_platform

import lora_serving.vllm_plugin as plugin
from lora_serving.vllm_plugin import cpu_no_lora_index

SLOTS, RANK, IN_FEATURES, OUT_FEATURES = 3, 8, 16, 24
# One slot index per token: two tokens of a base request (-1) sit between adapter requests.
TOKEN_SLOTS = torch.tensor([0, 0, -1, -1, 2, 1, 1, 1, -1, 2])


@pytest.fixture(autouse=True)
def restore_vllm_ops():
    """Undo whatever a test bound into vLLM's modules, so each test starts from the same state."""
    modules = [importlib.import_module(name) for name in cpu_no_lora_index.PATCHED_MODULES]
    saved = {
        (module, name): getattr(module, name)
        for module in modules
        for name in cpu_no_lora_index.FIXED_OPS
    }
    yield saved
    for (module, name), op in saved.items():
        setattr(module, name, op)


@pytest.fixture
def patched_ops():
    plugin.register()
    return punica_cpu  # the namespace PunicaWrapperCPU calls the ops through


def random_stacked(out_features: int, in_features: int) -> torch.Tensor:
    """Stacked per-slot weights as vLLM lays them out: [slots, 1, out, in], all non-zero."""
    return torch.randn(SLOTS, 1, out_features, in_features) + 3.0


def reference_delta(x: torch.Tensor, stacked: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """x @ W[slot].T computed slot by slot; rows with slot -1 stay zero."""
    delta = torch.zeros(x.shape[0], stacked.shape[-2])
    for slot in range(SLOTS):
        rows = slots == slot
        delta[rows] = torch.einsum("bi,oi->bo", x[rows], stacked[slot, 0])
    return delta


def prefill_metadata(slots: torch.Tensor) -> tuple:
    """The sgmv arguments vLLM builds for these token slots (seq starts ... token count)."""
    return compute_meta(slots)[:6]


def assert_rows(actual: torch.Tensor, expected: torch.Tensor, slots: torch.Tensor) -> None:
    """Rows without an adapter must match bit for bit; adapter rows up to float rounding (the ops
    and the reference sum in different orders: a few float32 ulps of values near 100)."""
    no_adapter = slots < 0
    assert torch.equal(actual[no_adapter], expected[no_adapter])
    torch.testing.assert_close(actual[~no_adapter], expected[~no_adapter], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kind", ["bgmv", "sgmv"])
def test_shrink_writes_zero_for_rows_without_adapter(patched_ops, kind):
    x = torch.randn(len(TOKEN_SLOTS), IN_FEATURES)
    lora_a = random_stacked(RANK, IN_FEATURES)
    buffer = torch.full((len(TOKEN_SLOTS), RANK), 7.0)  # stale values must not survive
    if kind == "bgmv":
        patched_ops.bgmv_shrink(x, lora_a, buffer, TOKEN_SLOTS, 0.5)
    else:
        patched_ops.sgmv_shrink(x, lora_a, buffer, *prefill_metadata(TOKEN_SLOTS), 0.5)

    assert_rows(buffer, 0.5 * reference_delta(x, lora_a, TOKEN_SLOTS), TOKEN_SLOTS)


@pytest.mark.parametrize("kind", ["bgmv", "sgmv"])
def test_expand_leaves_rows_without_adapter_untouched(patched_ops, kind):
    x = torch.randn(len(TOKEN_SLOTS), RANK)
    lora_b = random_stacked(OUT_FEATURES, RANK)
    base = torch.randn(len(TOKEN_SLOTS), OUT_FEATURES)
    y = base.clone()
    if kind == "bgmv":
        patched_ops.bgmv_expand(x, lora_b, y, TOKEN_SLOTS, True)
    else:
        patched_ops.sgmv_expand(x, lora_b, y, *prefill_metadata(TOKEN_SLOTS), True)

    assert_rows(y, base + reference_delta(x, lora_b, TOKEN_SLOTS), TOKEN_SLOTS)


@pytest.mark.parametrize("kind", ["bgmv", "sgmv"])
def test_long_prefill_grouped_by_slot_matches_row_by_row(patched_ops, kind):
    """Over GATHER_MAX_ROWS rows the ops multiply once per slot in use instead of copying the
    weights for every row; rows without an adapter stay exact zeros even if slot buffers hold
    NaN."""
    slots = TOKEN_SLOTS.repeat_interleave(8)  # 80 tokens, prefill-sized
    assert len(slots) > cpu_no_lora_index.GATHER_MAX_ROWS
    x = torch.randn(len(slots), IN_FEATURES)
    lora_a = random_stacked(RANK, IN_FEATURES)
    buffer = torch.full((len(slots), RANK), 7.0)
    if kind == "bgmv":
        patched_ops.bgmv_shrink(x, lora_a, buffer, slots, 0.5)
    else:
        patched_ops.sgmv_shrink(x, lora_a, buffer, *prefill_metadata(slots), 0.5)
    assert_rows(buffer, 0.5 * reference_delta(x, lora_a, slots), slots)

    untrained = random_stacked(RANK, IN_FEATURES)
    untrained[2] = 0  # the adapter in slot 2 does not train this module
    patched_ops.bgmv_shrink(x, untrained, buffer, slots, 1.0)
    assert torch.equal(buffer[slots == 2], torch.zeros_like(buffer[slots == 2]))
    assert_rows(buffer, reference_delta(x, untrained, slots), slots)

    lora_b = random_stacked(OUT_FEATURES, RANK)
    lora_b[1] = float("nan")  # slot 1 unused below: must not leak into any row
    only_0_2 = torch.where(slots == 1, -1, slots)
    base = torch.randn(len(slots), OUT_FEATURES)
    y = base.clone()
    patched_ops.bgmv_expand(buffer, lora_b, y, only_0_2, True)
    assert_rows(y, base + reference_delta(buffer, torch.nan_to_num(lora_b), only_0_2), only_0_2)


@pytest.mark.parametrize("rows", [len(TOKEN_SLOTS), 8 * len(TOKEN_SLOTS)])
def test_module_no_adapter_in_the_batch_trains_is_left_alone(patched_ops, rows):
    """A Whisper encoder layer under decoder-only adapters: every slot in use holds zeros. Over
    GATHER_MAX_ROWS rows the ops then compute nothing (no [rows, out] block of zeros to add);
    either way they add nothing and write zeros where they would have written a delta."""
    slots = TOKEN_SLOTS.repeat_interleave(rows // len(TOKEN_SLOTS))
    x = torch.randn(rows, RANK)
    lora_b = random_stacked(OUT_FEATURES, RANK)
    lora_b[[0, 1, 2]] = 0  # no adapter trains this module
    if rows > cpu_no_lora_index.GATHER_MAX_ROWS:
        assert cpu_no_lora_index._lora_product(x, lora_b, slots, torch.float32) is None

    base = torch.randn(rows, OUT_FEATURES + 4)
    y = base.clone()
    patched_ops.bgmv_expand(x, lora_b, y, slots, True)
    patched_ops.bgmv_expand_slice(x, lora_b, y, slots, 2, OUT_FEATURES, True)
    assert torch.equal(y, base)

    patched_ops.bgmv_expand_slice(x, lora_b, y, slots, 2, OUT_FEATURES, False)
    assert torch.equal(y[:, 2 : 2 + OUT_FEATURES], torch.zeros(rows, OUT_FEATURES))
    assert torch.equal(y[:, :2], base[:, :2]) and torch.equal(y[:, -2:], base[:, -2:])
    y = base.clone()
    patched_ops.bgmv_expand(x, lora_b, y, slots, False)
    assert torch.equal(y[:, :OUT_FEATURES], torch.zeros(rows, OUT_FEATURES))

    buffer = torch.full((rows, RANK), 7.0)
    lora_a = random_stacked(RANK, IN_FEATURES)
    lora_a[[0, 1, 2]] = 0
    patched_ops.bgmv_shrink(torch.randn(rows, IN_FEATURES), lora_a, buffer, slots, 0.5)
    assert torch.equal(buffer, torch.zeros(rows, RANK))


def test_few_rows_pick_their_own_slot_and_broadcast_as_upstream(patched_ops):
    """Decode-sized batches multiply every row by every slot at once and pick each row's slot:
    a NaN slot no row uses reaches no row, and upstream's broadcasting (one row for every index,
    one index for every row) still holds."""
    x = torch.randn(len(TOKEN_SLOTS), IN_FEATURES)
    lora_a = random_stacked(RANK, IN_FEATURES)
    lora_a[1] = float("nan")
    no_slot_1 = torch.where(TOKEN_SLOTS == 1, 0, TOKEN_SLOTS)
    buffer = torch.full((len(TOKEN_SLOTS), RANK), 7.0)
    patched_ops.bgmv_shrink(x, lora_a, buffer, no_slot_1, 1.0)
    assert_rows(buffer, reference_delta(x, torch.nan_to_num(lora_a), no_slot_1), no_slot_1)

    lora_a = random_stacked(RANK, IN_FEATURES)
    one_row = x[:1]
    broadcast_row = cpu_no_lora_index._lora_product(one_row, lora_a, TOKEN_SLOTS, torch.float32)
    expected = reference_delta(one_row.expand(len(TOKEN_SLOTS), -1), lora_a, TOKEN_SLOTS)
    assert_rows(broadcast_row, expected, TOKEN_SLOTS)
    one_index = torch.tensor([2])
    broadcast_index = cpu_no_lora_index._lora_product(x, lora_a, one_index, torch.float32)
    torch.testing.assert_close(broadcast_index, x @ lora_a[2, 0].T)


def test_expand_without_add_inputs_writes_zero_delta(patched_ops):
    x = torch.randn(len(TOKEN_SLOTS), RANK)
    lora_b = random_stacked(OUT_FEATURES, RANK)
    y = torch.full((len(TOKEN_SLOTS), OUT_FEATURES), 7.0)
    patched_ops.bgmv_expand(x, lora_b, y, TOKEN_SLOTS, False)

    assert_rows(y, reference_delta(x, lora_b, TOKEN_SLOTS), TOKEN_SLOTS)


@pytest.mark.parametrize("kind", ["bgmv", "sgmv"])
def test_expand_slice_changes_only_adapter_rows_of_its_slice(patched_ops, kind):
    offset, size = 4, OUT_FEATURES
    x = torch.randn(len(TOKEN_SLOTS), RANK)
    lora_b = random_stacked(size, RANK)
    base = torch.randn(len(TOKEN_SLOTS), offset + size + 4)
    y = base.clone()
    if kind == "bgmv":
        patched_ops.bgmv_expand_slice(x, lora_b, y, TOKEN_SLOTS, offset, size, True)
    else:
        metadata = prefill_metadata(TOKEN_SLOTS)
        patched_ops.sgmv_expand_slice(x, lora_b, y, *metadata, offset, size, True)

    expected = base.clone()
    expected[:, offset : offset + size] += reference_delta(x, lora_b, TOKEN_SLOTS)
    assert_rows(y, expected, TOKEN_SLOTS)


def cpu_wrapper_for(slots: list[int], adapter_ids: list[int]) -> punica_cpu.PunicaWrapperCPU:
    """A CPU punica wrapper mapped as vLLM maps a batch (adapter id 0 = no adapter)."""
    wrapper = punica_cpu.PunicaWrapperCPU(max_num_batched_tokens=64, max_batches=8, device="cpu")
    ids = [adapter_ids[slot] if slot >= 0 else 0 for slot in slots]
    mapping = LoRAMapping(index_mapping=ids, prompt_mapping=ids, is_prefill=True)
    wrapper.update_metadata(mapping, adapter_ids, max_loras=SLOTS, vocab_size=OUT_FEATURES)
    return wrapper


def test_cpu_wrapper_linear_and_logits_give_base_rows_zero_delta(patched_ops):
    """Through PunicaWrapperCPU, the way every LoRA layer (LM, tower, connector) calls it."""
    slots = TOKEN_SLOTS.tolist()
    wrapper = cpu_wrapper_for(slots, adapter_ids=[11, 12, 13])
    x = torch.randn(len(slots), IN_FEATURES)
    lora_a, lora_b = random_stacked(RANK, IN_FEATURES), random_stacked(OUT_FEATURES, RANK)
    expected_delta = reference_delta(reference_delta(x, lora_a, TOKEN_SLOTS), lora_b, TOKEN_SLOTS)

    base = torch.randn(len(slots), OUT_FEATURES)
    y = base.clone()
    wrapper.add_lora_linear(y, x, (lora_a,), (lora_b,), 1.0, (OUT_FEATURES,))
    assert_rows(y, base + expected_delta, TOKEN_SLOTS)

    logits = base.clone()  # one row per request here: logits use the sampler indices
    wrapper.add_lora_logits(logits, x, lora_a, lora_b, 1.0)
    assert_rows(logits, base + expected_delta, TOKEN_SLOTS)


def test_register_twice_applies_once_and_logs_once(caplog, monkeypatch):
    monkeypatch.setattr(plugin.logger, "propagate", False)
    caplog.set_level(logging.INFO, logger=plugin.logger.name)
    plugin.logger.addHandler(caplog.handler)
    try:
        plugin.register()
        first = {name: getattr(punica_cpu, name) for name in cpu_no_lora_index.FIXED_OPS}
        plugin.register()
    finally:
        plugin.logger.removeHandler(caplog.handler)

    assert cpu_no_lora_index.is_applied()
    assert first == {name: getattr(punica_cpu, name) for name in cpu_no_lora_index.FIXED_OPS}
    applied_lines = [r.getMessage() for r in caplog.records if "applied" in r.getMessage()]
    assert len(applied_lines) == 1, applied_lines
    assert "cpu_no_lora_index" in applied_lines[0]


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "1.0.0", "dev"])
def test_register_refuses_unsupported_vllm(monkeypatch, restore_vllm_ops, version):
    monkeypatch.setattr(vllm.version, "__version__", version)

    with pytest.raises(RuntimeError, match=r"supports vLLM 0\.32\.x"):
        plugin.register()
    assert all(getattr(module, name) is op for (module, name), op in restore_vllm_ops.items())


@pytest.mark.parametrize("version", ["0.32.0", "0.32.3", "0.32.1rc1", "0.32.2.dev5+gabc1234"])
def test_version_guard_accepts_any_0_32_release(version):
    plugin.check_vllm_version(version)


def shrink_with_new_argument(inputs, lora_b_weights, output_tensor, lora_indices, scaling, extra):
    """Stands in for an upstream op whose interface changed."""


shrink_with_new_argument.__module__ = cpu_no_lora_index.UPSTREAM_OPS_MODULE


@pytest.mark.parametrize(
    ("replacement", "message"),
    [
        (lambda *args: None, r"is .*, not vLLM's torch op"),
        (shrink_with_new_argument, r"has signature \(.*extra\)"),
    ],
)
def test_register_refuses_ops_it_was_not_written_for(monkeypatch, replacement, message):
    monkeypatch.setattr(punica_cpu, "bgmv_shrink", replacement)

    with pytest.raises(RuntimeError, match=rf"punica_cpu\.bgmv_shrink {message}"):
        plugin.register()


def test_register_leaves_other_platforms_alone(monkeypatch, restore_vllm_ops):
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)

    plugin.register()

    assert all(getattr(module, name) is op for (module, name), op in restore_vllm_ops.items())


def test_whisper_decoder_prompt_is_used_as_given():
    """vLLM prepends <|startoftranscript|> to a decoder prompt unless the processor says its
    prompts are complete; after register() Whisper's does, and vLLM's own prefixing function is
    not reached (upstream issue 53206)."""
    from vllm.inputs.engine import build_enc_dec_input
    from vllm.model_executor.models.whisper import WhisperMultiModalProcessor

    from lora_serving.vllm_plugin import whisper_decoder_prompt

    saved = WhisperMultiModalProcessor.skip_decoder_start_token
    try:
        WhisperMultiModalProcessor.skip_decoder_start_token = False
        assert not whisper_decoder_prompt.applied()
        plugin.register()
        assert whisper_decoder_prompt.applied()
        assert not whisper_decoder_prompt.apply()  # a second time changes nothing
    finally:
        WhisperMultiModalProcessor.skip_decoder_start_token = saved
    prev, sot = 50361, 50258
    encoder = {"type": "token", "prompt_token_ids": []}
    decoder = {"type": "token", "prompt_token_ids": [prev, 1, 2, sot]}
    kept = build_enc_dec_input(encoder, dict(decoder), sot, skip_decoder_start_token=True)
    prefixed = build_enc_dec_input(encoder, dict(decoder), sot)
    assert kept["decoder_prompt"]["prompt_token_ids"] == [prev, 1, 2, sot]
    assert prefixed["decoder_prompt"]["prompt_token_ids"] == [sot, prev, 1, 2, sot]


def test_fixes_table_names_every_fix_module_once_and_the_docs_table_matches_it():
    """register() applies FIXES only: a fix module left out of it would never run, and the
    docs' table is the one readers see."""
    package = Path(plugin.__file__).parent
    with_apply = sorted(
        file.stem for file in package.glob("*.py") if "\ndef apply(" in file.read_text()
    )
    names = [fix.module for fix in plugin.FIXES]
    assert sorted(names) == with_apply and len(set(names)) == len(names)
    order = names.index("whisper_encoder_memo") < names.index("whisper_cross_kv_memo")
    assert order  # the K/V memo wraps the encoder memo's wrapper
    docs = (Path(__file__).resolve().parents[2] / "docs" / "vllm-plugin.md").read_text()
    documented = re.findall(r"^\| `(\w+)` \|", docs, flags=re.MULTILINE)
    assert sorted(documented) == sorted(names)
