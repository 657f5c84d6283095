"""Qwen2.5-VL is selected in model.json: reload qwen_vl_lora with it through Triton's repository
API (the shared server runs in explicit model-control mode), check it against its merged
reference, then restore the repository's own configuration for the other tests."""

import io
import json

import pytest
import tritonclient.grpc as grpcclient
from PIL import Image

from tests.conftest import REPO
from tests.e2e.test_serving_stack import PROMPT, png, qwen_inputs
from tests.e2e.triton_calls import grpc_many

MODEL_DIR = REPO / "model_repository" / "qwen_vl_lora"


def model_files(model_json: dict, multi_lora: dict) -> dict[str, bytes]:
    """The files of an overridden model version (Triton loads only what is given)."""
    return {
        "file:1/model.py": (MODEL_DIR / "1" / "model.py").read_bytes(),
        "file:1/model.json": json.dumps(model_json).encode(),
        "file:1/multi_lora.json": json.dumps(multi_lora).encode(),
    }


@pytest.fixture
def qwen2_5_loaded(grpc_url, demo_models):
    client = grpcclient.InferenceServerClient(grpc_url)
    config = client.get_model_config("qwen_vl_lora", as_json=True)["config"]
    # Triton skips a reload whose config is unchanged, even when new files are given.
    config.setdefault("parameters", {})["variant"] = {"string_value": "qwen2_5_vl"}
    config = json.dumps(config)
    model_json = json.loads((MODEL_DIR / "1" / "model.json").read_text())
    model_json["model"] = str(demo_models / "qwen2_5-vl-tiny")
    adapters = {name: str(demo_models / "qwen2_5-vl-adapters" / name) for name in ("alpha", "beta")}
    client.load_model("qwen_vl_lora", config=config, files=model_files(model_json, adapters))
    try:
        yield
    finally:
        client.load_model("qwen_vl_lora")  # back to the repository's files
        assert client.is_model_ready("qwen_vl_lora")


def test_qwen2_5_vl_selected_in_model_json_matches_reference(grpc_url, demo_models, qwen2_5_loaded):
    from lora_serving.reference.qwen_vl import reference_generate
    from lora_serving.tasks import load_tokenizer

    base = demo_models / "qwen2_5-vl-tiny"
    names = [None, "alpha", "beta"]
    outcomes = grpc_many(
        grpc_url, "qwen_vl_lora", [(qwen_inputs(), {"lora_name": n} if n else None) for n in names]
    )
    tokenizer = load_tokenizer(str(base))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    image = Image.open(io.BytesIO(png())).convert("RGB")
    texts = []
    for name, outcome in zip(names, outcomes, strict=True):
        adapter = demo_models / "qwen2_5-vl-adapters" / name if name else None
        tokens, _ = reference_generate(base, adapter, prompt, [image], 16)
        assert outcome.text == tokenizer.decode(tokens, skip_special_tokens=True), name
        texts.append(outcome.text)
    assert len(set(texts)) == 3, texts
