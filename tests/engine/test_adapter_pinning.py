"""Real engine: a pinned adapter stays in vLLM's adapter cache while a long tail passes through.

whisper-base with room for 2 adapters in the cache (max_cpu_loras) and 1 in a batch slot
(max_loras). Our worker extension (engine.lora_slots, the method the fleet's pinning calls)
pins `alpha` in the cache; `beta`, `cross_kv` and `encoder_only` then come and go. Without the
pin vLLM evicts alpha (least recently used), with it alpha stays and the others still serve.
"""

import gc

import pytest
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest

from lora_serving.engine.lora_slots import EXTENSION, PIN_METHOD
from tests.conftest import load_16k

pytestmark = pytest.mark.engine

TAIL = ("beta", "cross_kv", "encoder_only")
PROMPT = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")


@pytest.fixture(scope="module")
def engine(demo_models):
    llm = LLM(
        model=str(demo_models / "whisper-base"),
        dtype="float32",
        enforce_eager=True,
        enable_lora=True,
        enable_tower_connector_lora=True,
        max_loras=1,
        max_cpu_loras=2,
        max_lora_rank=16,
        max_model_len=448,
        max_num_seqs=4,
        limit_mm_per_prompt={"audio": 1},
        worker_extension_cls=EXTENSION,
    )
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def request(demo_models, name: str, int_id: int) -> LoRARequest:
    return LoRARequest(name, int_id, str(demo_models / "whisper-adapters" / name))


def cached(llm) -> set[int]:
    return set(llm.llm_engine.list_loras())


def test_pinned_adapter_stays_cached_through_a_long_tail(engine, demo_models, speech):
    from transformers import AutoTokenizer

    engine.llm_engine.add_lora(request(demo_models, "alpha", 1))
    for int_id, name in enumerate(TAIL[:2], start=2):
        engine.llm_engine.add_lora(request(demo_models, name, int_id))
    assert cached(engine) == {2, 3}  # unpinned, alpha was the least recently used

    engine.llm_engine.add_lora(request(demo_models, "alpha", 4))
    engine.collective_rpc(PIN_METHOD, args=(4,))
    for int_id, name in enumerate(TAIL, start=5):
        engine.llm_engine.add_lora(request(demo_models, name, int_id))
        assert 4 in cached(engine) and int_id in cached(engine)

    # The tail still decodes, each adapter moved through the one batch slot beside the pin.
    tokenizer = AutoTokenizer.from_pretrained(str(demo_models / "whisper-base"))
    audio = load_16k(speech("Pinned adapters stay in memory."))
    prompt = {
        "encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (audio, 16_000)}},
        "decoder_prompt": {"prompt_token_ids": tokenizer.convert_tokens_to_ids(list(PROMPT))},
    }
    tail = [request(demo_models, name, 8 + i) for i, name in enumerate(TAIL)]
    outputs = engine.generate(
        [prompt] * len(tail),
        SamplingParams(temperature=0.0, max_tokens=8),
        lora_request=tail,
        use_tqdm=False,
    )
    assert all(output.outputs[0].token_ids for output in outputs)
    assert 4 in cached(engine)

    with pytest.raises(Exception, match="not in cache"):
        engine.collective_rpc(PIN_METHOD, args=(99,))  # not added: refused, engine still up
    assert 4 in cached(engine)
