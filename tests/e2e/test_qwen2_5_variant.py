"""Qwen2.5-VL is selected in model.json: reload qwen_vl_lora with it through Triton's repository
API (the shared server runs in explicit model-control mode) and check it against its merged
reference. It runs after every other module that uses qwen_vl_lora (tests/conftest.py orders
it), so the model stays on this configuration afterwards.

The one reload also changes the image limits (mm_processor_kwargs) and turns resizing off, so
this module shows both reach the model: every test here runs on that configuration.
"""

import json
import os

import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import REPO
from tests.e2e.test_qwen_vl_lora import (
    MAX_TOKENS,
    NAMES,
    adapter_parameters,
    chat_prompt,
    picture,
    prompt_tokens,
    reference_text,
    rgb,
    send_mixed,
    video_frames,
)
from tests.e2e.test_serving_stack import PROMPT, png, qwen_inputs
from tests.e2e.triton_calls import grpc_many, grpc_one, sampling

MODEL_DIR = REPO / "model_repository" / "qwen_vl_lora"
# 8 to 16 image tokens (28 x 28 pixels each): the demo image (96 x 64) is scaled up to 12 tokens.
IMAGE_LIMITS = {"min_pixels": 8 * 784, "max_pixels": 16 * 784}


def model_files(model_json: dict, multi_lora: dict) -> dict[str, bytes]:
    """The files of an overridden model version (Triton loads only what is given)."""
    return {
        "file:1/model.py": (MODEL_DIR / "1" / "model.py").read_bytes(),
        "file:1/model.json": json.dumps(model_json).encode(),
        "file:1/multi_lora.json": json.dumps(multi_lora).encode(),
    }


@pytest.fixture(scope="module")
def qwen2_5_loaded(grpc_url, demo_models):
    client = grpcclient.InferenceServerClient(grpc_url)
    config = client.get_model_config("qwen_vl_lora", as_json=True)["config"]
    # Triton skips a reload whose config is unchanged, even when new files are given.
    config.setdefault("parameters", {})["variant"] = {"string_value": "qwen2_5_vl"}
    config = json.dumps(config)
    model_json = json.loads((MODEL_DIR / "1" / "model.json").read_text())
    model_json["model"] = str(demo_models / "qwen2_5-vl-tiny")
    model_json["mm_processor_kwargs"] = {"images_kwargs": IMAGE_LIMITS}
    model_json["serving"]["task"] = {**model_json["serving"]["task"], "resize_images": False}
    adapters = {name: str(demo_models / "qwen2_5-vl-adapters" / name) for name in ("alpha", "beta")}
    client.load_model("qwen_vl_lora", config=config, files=model_files(model_json, adapters))
    # No restore: this module runs after every other user of qwen_vl_lora (RELOADING_MODULES in
    # tests/conftest.py), and a reload back would start one more engine for nobody.


@pytest.fixture(scope="module")
def qwen2_5(demo_models, tmp_path_factory, qwen2_5_loaded):
    """(reference base folder with the served image limits, adapters folder)."""
    base = demo_models / "qwen2_5-vl-tiny"
    limited = tmp_path_factory.mktemp("qwen2_5_limits")
    for path in base.iterdir():
        if path.name != "preprocessor_config.json":
            os.symlink(path, limited / path.name)
    config = json.loads((base / "preprocessor_config.json").read_text())
    config["size"] = {
        "shortest_edge": IMAGE_LIMITS["min_pixels"],
        "longest_edge": IMAGE_LIMITS["max_pixels"],
    }
    (limited / "preprocessor_config.json").write_text(json.dumps(config))
    return limited, demo_models / "qwen2_5-vl-adapters"


def test_qwen2_5_vl_selected_in_model_json_matches_reference(grpc_url, qwen2_5):
    """Each adapter alone, then {base, alpha, beta} in shared batches."""
    base, adapters = qwen2_5
    prompt = chat_prompt(base, PROMPT, images=1)
    expected = {name: reference_text(base, adapters, name, prompt, [png()]) for name in NAMES}
    solo = {
        name: grpc_one(grpc_url, "qwen_vl_lora", qwen_inputs(), adapter_parameters(name))
        for name in NAMES
    }
    mixed = send_mixed(grpc_url, qwen_inputs())
    for name in NAMES:
        assert solo[name].text == expected[name], name
        assert mixed[name].text == expected[name], name
    assert len(set(expected.values())) == 3, expected


def test_configured_pixel_limits_reach_the_processor(grpc_url, qwen2_5, demo_models):
    """min_pixels from model.json scales the small demo image up: more image tokens."""
    base, _ = qwen2_5
    prompt = chat_prompt(base, PROMPT, images=1)
    outcome = grpc_one(grpc_url, "qwen_vl_lora", qwen_inputs())
    served = outcome.outputs["num_input_tokens"][0]
    assert served == prompt_tokens(base, prompt, [png()])
    default = prompt_tokens(demo_models / "qwen2_5-vl-tiny", prompt, [png()])
    assert served == default + 6, (served, default)  # 12 image tokens instead of 6


def test_image_over_max_pixels_refused_when_resizing_is_off(grpc_url, qwen2_5):
    base, adapters = qwen2_5
    large = picture((150, 100))  # 15000 pixels > 12544
    refused, served = grpc_many(
        grpc_url,
        "qwen_vl_lora",
        [(qwen_inputs(image=[large]), None), (qwen_inputs(), {"lora_name": "alpha"})],
    )
    assert "image[0] has 150x100 = 15000 pixels, over this model's max_pixels of 12544" in (
        refused.error or ""
    ), refused.error
    assert "resize_images" in refused.error
    prompt = chat_prompt(base, PROMPT, images=1)
    assert served.text == reference_text(base, adapters, "alpha", prompt, [png()])
    assert grpcclient.InferenceServerClient(grpc_url).is_model_ready("qwen_vl_lora")


def test_video_with_fps_mixed_adapters_match_reference(grpc_url, qwen2_5):
    """Qwen2.5-VL spaces video positions by time: video_fps reaches the model (4 fps here).

    The frames are chosen so that transformers 5.19 and vLLM 0.32 agree on the positions of the
    text after the video: for longer videos transformers continues at start + max(h, w) / 2
    while vLLM (like upstream Qwen2.5-VL) continues after the largest video position.
    """
    import numpy as np

    base, adapters = qwen2_5
    frames = video_frames()
    fields = {
        "text_input": "What happens?",
        "video": frames,
        "video_fps": np.array([[4.0]], dtype=np.float32),
        "exclude_input_in_output": True,
        "sampling_parameters": sampling(max_tokens=MAX_TOKENS),
    }
    outcomes = send_mixed(grpc_url, fields)
    prompt = chat_prompt(base, "What happens?", video=True)
    videos = [[rgb(frame) for frame in frames]]
    for name, outcome in outcomes.items():
        expected = reference_text(base, adapters, name, prompt, videos=videos, video_fps=4.0)
        assert outcome.text == expected, name
