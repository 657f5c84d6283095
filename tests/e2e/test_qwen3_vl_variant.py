"""Qwen3-VL named in model.json: qwen_vl_lora reloaded once with the demo Qwen3-VL (through
Triton's repository API, as test_qwen2_5_variant does); it runs last (tests/conftest.py), so the
model is not restored.

Every adapter module kind (language model, vision blocks, merger, deepstack mergers, and two on
all kinds) shares batches with the base model, images and videos at once, through Triton
(tritonclient), and through the OpenAI front (openai SDK, images: the front takes no video); each
answer equals transformers' greedy decoding on the PEFT-merged float32 weights. genai-perf
profiles the Qwen3-VL model with zero errors. The one-batch test also compares token ids and
logprobs with the reference (it took over the former engine-only test's checks).
"""

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import DEMO, only_with_model
from tests.e2e.test_genai_perf import genai_perf, profile_with_zero_errors  # noqa: F401
from tests.e2e.test_openai_api import IMAGE_URL, call, front, ok, sdk  # noqa: F401
from tests.e2e.test_qwen2_5_variant import MODEL_DIR, model_files
from tests.e2e.test_qwen_vl_lora import MAX_TOKENS, chat_prompt, rgb, video_frames
from tests.e2e.test_serving_stack import PROMPT, png, qwen_inputs
from tests.e2e.triton_calls import grpc_many, sampling

MODEL = "qwen_vl_lora"
VIDEO_PROMPT = "What happens?"
VIDEO_FPS = 4.0
LOAD_TIMEOUT_S = 600
# Logprobs of the same tokens differ only by float32 rounding between the two implementations.
LOGPROB_TOLERANCE = 1e-3

pytestmark = only_with_model(MODEL)


@pytest.fixture(scope="module")
def qwen3(demo_models):
    """(base folder, adapters folder, adapter names)."""
    from lora_tools.demo.qwen3_vl import ADAPTER_PATTERNS

    return demo_models / "qwen3-vl-tiny", demo_models / "qwen3-vl-adapters", tuple(ADAPTER_PATTERNS)


@pytest.fixture(scope="module")
def qwen3_loaded(grpc_url, qwen3):
    base, adapters, names = qwen3
    client = grpcclient.InferenceServerClient(grpc_url)
    config = client.get_model_config(MODEL, as_json=True)["config"]
    # Triton skips a reload whose config is unchanged, even when new files are given.
    config.setdefault("parameters", {})["variant"] = {"string_value": "qwen3_vl"}
    model_json = json.loads((MODEL_DIR / "1" / "model.json").read_text())
    model_json["model"] = str(base)
    model_json.pop("mm_processor_kwargs")  # the repository's pixel limits are Qwen2-VL's
    model_json["max_loras"] = len(names)  # every adapter in one batch
    multi_lora = {name: str(adapters / name) for name in names}
    client.load_model(
        MODEL,
        config=json.dumps(config),
        files=model_files(model_json, multi_lora),
        client_timeout=LOAD_TIMEOUT_S,  # a stuck load fails the module instead of hanging it
    )
    # No restore: this module runs last of all (RELOADING_MODULES in tests/conftest.py).


def reference_text(base, adapters, name, prompt, images=(), **kwargs) -> str:
    """The merged reference's greedy completion as the server streams it: a last token that
    ends inside a character is held back (random weights here do end so)."""
    from lora_serving.tasks import load_tokenizer
    from tests.reference.qwen_vl import reference_generate, streamed_text

    adapter = adapters / name if name else None
    images = [rgb(data) for data in images]
    tokens, _ = reference_generate(base, adapter, prompt, images, MAX_TOKENS, **kwargs)
    return streamed_text(load_tokenizer(str(base)), tokens)


def _parameters(name):
    return {"lora_name": name} if name else None


def test_every_module_kind_in_one_batch_with_image_and_video(grpc_url, qwen3, qwen3_loaded):
    """Base and six adapters, each with an image and with a video, all sent at once: every
    answer's token ids equal the merged reference's and its logprobs are within float32
    rounding (this test took over tests/engine/test_qwen3_vl_lora.py's token and logprob checks,
    through Triton, so that no second engine starts for them)."""
    base, adapters, names = qwen3
    everyone = (None, *names)
    with_logprobs = {
        "sampling_parameters": sampling(max_tokens=MAX_TOKENS, logprobs=0),
        "return_logprobs": True,
    }
    video = {
        "text_input": VIDEO_PROMPT,
        "video": video_frames(),
        "video_fps": np.array([[VIDEO_FPS]], dtype=np.float32),
        "exclude_input_in_output": True,
        **with_logprobs,
    }
    # Images and videos at once, so that steps encode both: vLLM 0.32 alone sets one tower LoRA
    # mapping for all of a step's media but runs the encoder per modality, and the engine died
    # (our plugin's tower_lora_per_modality encodes each modality with its own mapping).
    outcomes = grpc_many(
        grpc_url,
        MODEL,
        [(qwen_inputs(**with_logprobs), _parameters(n)) for n in everyone]
        + [(video, _parameters(n)) for n in everyone],
    )

    frames = [[rgb(frame) for frame in video_frames()]]
    media = {
        "image": (chat_prompt(base, PROMPT, images=1), {"images": [rgb(png())]}),
        "video": (
            chat_prompt(base, VIDEO_PROMPT, video=True),
            {"images": [], "videos": frames, "video_fps": VIDEO_FPS},
        ),
    }
    from lora_serving.tasks import load_tokenizer
    from tests.reference.qwen_vl import reference_generate, streamed_text

    tokenizer = load_tokenizer(str(base))
    answers: dict[str, set[tuple[int, ...]]] = {kind: set() for kind in media}
    worst = 0.0
    for index, (kind, name) in enumerate((k, n) for k in media for n in everyone):
        outcome = outcomes[index]
        assert outcome.error is None, (kind, name, outcome.error)
        prompt, kwargs = media[kind]
        adapter = adapters / name if name else None
        tokens, logprobs = reference_generate(
            base, adapter, prompt, max_tokens=MAX_TOKENS, **kwargs
        )
        steps = json.loads(outcome.outputs["logprobs"][0])
        got = [(int(token), entry["logprob"]) for step in steps for token, entry in step.items()]
        assert [token for token, _ in got] == tokens, (kind, name)
        worst = max(worst, *(abs(a - b) for (_, a), b in zip(got, logprobs, strict=True)))
        assert outcome.text == streamed_text(tokenizer, tokens), (kind, name)
        answers[kind].add(tuple(tokens))
    print(f"max |logprob difference| {worst:.2e} over {len(outcomes)} requests")
    assert worst < LOGPROB_TOLERANCE
    # Each module kind changes the answer: no adapter part is silently ignored.
    assert all(len(seen) == len(everyone) for seen in answers.values()), answers


def test_openai_sdk_chat_with_an_image(sdk, qwen3, qwen3_loaded):  # noqa: F811
    """The openai SDK through lora-openai: base, and the deepstack-only adapter streamed."""
    base, adapters, _ = qwen3
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": IMAGE_URL}},
                {"type": "text", "text": PROMPT},
            ],
        }
    ]
    common = {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    plain, streamed = sdk(
        call("chat", model=MODEL, **common),
        call("chat_stream", model=f"{MODEL}/deepstack", **common),
    )
    prompt = chat_prompt(base, PROMPT, images=1)
    assert ok(plain)["choices"][0]["message"]["content"] == reference_text(
        base, adapters, None, prompt, [png()]
    )
    chunks = ok(streamed)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == reference_text(base, adapters, "deepstack", prompt, [png()])


def test_genai_perf_profiles_qwen3_vl(genai_perf, grpc_url, tmp_path, qwen3_loaded):  # noqa: F811
    profile_with_zero_errors(genai_perf, grpc_url, tmp_path, DEMO / "qwen3-vl-tiny", True)
