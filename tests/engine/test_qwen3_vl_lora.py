"""Qwen3-VL LoRA on every module kind (real vLLM engine, no Triton) equals the merged reference.

vLLM 0.32 serves Qwen3-VL's tower LoRA through `enable_tower_connector_lora`: `visual.` blocks on
the tower's LoRA mapping, `visual.merger` and `visual.deepstack_merger_list` on the connector's.
One engine, one batch of image and video prompts interleaved, each with the base model and one
adapter per module kind (language model, vision blocks, merger, deepstack mergers) plus two on all
kinds, so every adapter shares its batch with the base request and with the others, and the
encoder steps hold both modalities. Each output
must equal transformers' greedy decoding on the PEFT-merged float32 weights, token for token.
"""

import io

import pytest
from PIL import Image

from tests.e2e.test_qwen_vl_lora import picture, video_frames

pytestmark = pytest.mark.engine

MAX_TOKENS = 12
VIDEO_FPS = 4.0
# Logprobs of the same tokens differ only by float32 rounding between the two implementations.
LOGPROB_TOLERANCE = 1e-3


def rgb(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


@pytest.fixture(scope="module")
def qwen3(demo_models):
    from lora_serving.demo.qwen3_vl import ADAPTER_PATTERNS

    base = demo_models / "qwen3-vl-tiny"
    return base, {name: demo_models / "qwen3-vl-adapters" / name for name in ADAPTER_PATTERNS}


@pytest.fixture(scope="module")
def served(qwen3):
    """{(media, adapter): (token ids, logprobs)} from one vLLM engine, one batch of both media."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    from lora_serving.tasks import load_tokenizer
    from lora_serving.vision import video_metadata

    base, adapters = qwen3
    llm = LLM(
        model=str(base),
        dtype="float32",
        enforce_eager=True,
        enable_lora=True,
        enable_tower_connector_lora=True,
        max_loras=len(adapters),
        max_lora_rank=8,
        max_model_len=2048,
        max_num_seqs=2 * (len(adapters) + 1),
        limit_mm_per_prompt={"image": 1, "video": 1},
        enable_prefix_caching=False,  # every request's prefill runs in its mixed batch
        seed=0,
    )
    tokenizer = load_tokenizer(str(base))
    loras = {None: None} | {
        name: LoRARequest(name, lora_id, str(path))
        for lora_id, (name, path) in enumerate(adapters.items(), start=1)
    }
    frames = [rgb(frame) for frame in video_frames()]
    import numpy as np

    media = {
        "image": {"image": rgb(picture())},
        "video": {
            "video": (np.stack([np.asarray(f) for f in frames]), video_metadata(5, VIDEO_FPS))
        },
    }
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=0)
    # Images and videos interleaved in one batch, so its first step encodes both modalities
    # (vLLM alone died there: our plugin's tower_lora_per_modality).
    keys = [(kind, name) for name in loras for kind in media]
    requests = [
        {"prompt": chat_prompt(tokenizer, kind), "multi_modal_data": media[kind]}
        for kind, _ in keys
    ]
    outputs = llm.generate(requests, params, lora_request=[loras[name] for _, name in keys])
    results = {}
    for key, output in zip(keys, outputs, strict=True):
        completion = output.outputs[0]
        logprobs = [
            step[token].logprob
            for token, step in zip(completion.token_ids, completion.logprobs, strict=True)
        ]
        results[key] = (list(completion.token_ids), logprobs)
    return results


def chat_prompt(tokenizer, kind: str) -> str:
    content = [{"type": kind}, {"type": "text", "text": "Describe this."}]
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )


@pytest.mark.parametrize("kind", ["image", "video"])
def test_every_module_kind_matches_merged_reference_in_one_batch(qwen3, served, kind):
    from lora_serving.reference.qwen_vl import reference_generate
    from lora_serving.tasks import load_tokenizer

    base, adapters = qwen3
    prompt = chat_prompt(load_tokenizer(str(base)), kind)
    media = (
        {"images": [rgb(picture())]}
        if kind == "image"
        else {"images": [], "videos": [[rgb(f) for f in video_frames()]], "video_fps": VIDEO_FPS}
    )
    expected = {}
    for name in (None, *adapters):
        adapter = adapters[name] if name else None
        expected[name] = reference_generate(base, adapter, prompt, max_tokens=MAX_TOKENS, **media)
    worst = 0.0
    for name, (tokens, logprobs) in expected.items():
        got_tokens, got_logprobs = served[kind, name]
        assert got_tokens == tokens, (kind, name)
        worst = max(worst, *(abs(a - b) for a, b in zip(got_logprobs, logprobs, strict=True)))
    print(f"{kind}: max |logprob difference| {worst:.2e} over {len(expected)} requests")
    assert worst < LOGPROB_TOLERANCE
    # Every module kind changes the output: none of them is silently ignored.
    assert len({tuple(tokens) for tokens, _ in expected.values()}) == len(expected)
