"""qwen_vl_lora (Qwen2-VL, the repository's model.json) through a real tritonserver: several
images, video, vllm_backend's request shape, the vision part of the adapter, the describe command,
and adapters refused at load. Bad inputs of both models are in test_bad_inputs.py.

Outputs are compared with the merged-weights reference (LM + vision blocks + merger merged by
PEFT, greedy, float32) token for token. Single-image {base, alpha, beta} alone and mixed are in
test_serving_stack.py; Qwen2.5-VL is in test_qwen2_5_variant.py.
"""

import base64
import io
import json

import pytest
import tritonclient.grpc as grpcclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from tests.conftest import REPO
from tests.e2e.triton_calls import grpc_many, grpc_one, sampling

MODEL = "qwen_vl_lora"
MODEL_DIR = REPO / "model_repository" / MODEL
NAMES = (None, "alpha", "beta")
MAX_TOKENS = 16


# ---- media and references (shared with test_qwen2_5_variant.py) ---------------------------------
def picture(size=(96, 64), shade=0) -> bytes:
    """A PNG with some structure, so the vision tower has something to see."""
    image = Image.new("RGB", size, (200, 30 + shade, 30))
    for x in range(0, size[0], 6):
        for y in range(0, size[1], 6):
            image.putpixel((x, y), ((x * 3 + shade) % 256, (y * 5) % 256, 90))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def video_frames(count=5, size=(120, 90)) -> list[bytes]:
    return [picture(size, shade=40 * i) for i in range(count)]


def rgb(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def chat_prompt(base, text: str, images: int = 0, video: bool = False) -> str:
    """The templated prompt the server builds (images, then the video, then the text)."""
    from lora_serving.tasks import load_tokenizer

    content = [{"type": "image"}] * images + [{"type": "video"}] * video
    content.append({"type": "text", "text": text})
    return load_tokenizer(str(base)).apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )


def reference_text(base, adapters, name, prompt, images=(), **kwargs) -> str:
    """The merged reference's greedy completion for one adapter (None = base), decoded."""
    from lora_serving.tasks import load_tokenizer
    from tests.reference.qwen_vl import reference_generate

    adapter = adapters / name if name else None
    tokens, _ = reference_generate(
        base, adapter, prompt, [rgb(d) for d in images], MAX_TOKENS, **kwargs
    )
    return load_tokenizer(str(base)).decode(tokens, skip_special_tokens=True)


def prompt_tokens(base, prompt, images=(), frames=(), fps=2.0) -> int:
    """How many tokens the model's own processor makes of the prompt and media."""
    from transformers import AutoProcessor

    from lora_tools.demo.qwen_vl import video_metadata

    media = {"images": [rgb(d) for d in images] or None}
    if frames:
        media["videos"] = [[rgb(d) for d in frames]]
        media["video_metadata"] = [video_metadata(len(frames), fps)]
    processed = AutoProcessor.from_pretrained(base)(text=[prompt], return_tensors="pt", **media)
    return processed["input_ids"].shape[1]


def adapter_parameters(name):
    return {"lora_name": name} if name else None


def send_mixed(grpc_url, fields: dict) -> dict:
    """{base, alpha, beta} at the same time, so Triton and vLLM batch them together."""
    outcomes = grpc_many(grpc_url, MODEL, [(fields, adapter_parameters(n)) for n in NAMES])
    return dict(zip(NAMES, outcomes, strict=True))


@pytest.fixture(scope="module")
def qwen2(demo_models):
    return demo_models / "qwen2-vl-tiny", demo_models / "qwen2-vl-adapters"


# ---- several images, video, vllm_backend's request shape ----------------------------------------
PROMPT = "Compare these."
# The second image is larger than max_pixels (50176): the model's processor scales it down.
IMAGES = (picture(), picture((400, 300), shade=70))


@pytest.fixture(scope="module")
def multi_image(grpc_url):
    fields = {
        "text_input": PROMPT,
        "image": list(IMAGES),
        "exclude_input_in_output": True,
        "sampling_parameters": sampling(max_tokens=MAX_TOKENS),
        "return_num_input_tokens": True,
    }
    return send_mixed(grpc_url, fields)


def test_several_images_mixed_adapters_match_reference(multi_image, qwen2):
    base, adapters = qwen2
    prompt = chat_prompt(base, PROMPT, images=2)
    expected_tokens = prompt_tokens(base, prompt, IMAGES)
    for name, outcome in multi_image.items():
        assert outcome.text == reference_text(base, adapters, name, prompt, IMAGES), name
        assert outcome.outputs["num_input_tokens"] == [expected_tokens]
    assert len({outcome.text for outcome in multi_image.values()}) == 3


def test_vision_part_of_the_adapter_matters(multi_image, qwen2):
    """Merging only the language-model part of the adapter gives other tokens than served."""
    base, adapters = qwen2
    prompt = chat_prompt(base, PROMPT, images=2)
    for name in ("alpha", "beta"):
        lm_only = reference_text(base, adapters, name, prompt, IMAGES, merge="language_only")
        assert multi_image[name].text != lm_only, name


def test_video_frames_mixed_adapters_match_reference(grpc_url, qwen2):
    base, adapters = qwen2
    # 6 frames: with 5, beta's 10th token is <|video_pad|>, and the reference (transformers)
    # then counts a video slot the prompt does not have (vLLM has no such problem).
    frames = video_frames(6)
    fields = {
        "text_input": "What happens?",
        "video": frames,
        "video_fps": _fps(2.0),
        "exclude_input_in_output": True,
        "sampling_parameters": sampling(max_tokens=MAX_TOKENS),
        "return_num_input_tokens": True,
    }
    outcomes = send_mixed(grpc_url, fields)
    prompt = chat_prompt(base, "What happens?", video=True)
    videos = [[rgb(frame) for frame in frames]]
    for name, outcome in outcomes.items():
        expected = reference_text(base, adapters, name, prompt, videos=videos, video_fps=2.0)
        assert outcome.text == expected, name
        assert outcome.outputs["num_input_tokens"] == [prompt_tokens(base, prompt, frames=frames)]


def test_image_and_video_in_one_request(grpc_url, qwen2):
    base, adapters = qwen2
    frames = video_frames(3, size=(84, 56))
    fields = {"text_input": "And now?", "image": [IMAGES[0]], "video": frames}
    outcome = grpc_one(
        grpc_url,
        MODEL,
        {**fields, "exclude_input_in_output": True, "sampling_parameters": sampling(max_tokens=16)},
        {"lora_name": "beta"},
    )
    prompt = chat_prompt(base, "And now?", images=1, video=True)
    videos = [[rgb(frame) for frame in frames]]
    assert outcome.text == reference_text(
        base, adapters, "beta", prompt, [IMAGES[0]], videos=videos
    )


def test_vllm_backend_request_shape_unchanged(grpc_url, qwen2):
    """text_input + base64 image + sampling_parameters holding lora_name, on a gRPC stream;
    no input of ours, so the prompt comes back before the completion, as vllm_backend does."""
    base, adapters = qwen2
    fields = {
        "text_input": "Describe this image.",
        "image": [base64.b64encode(IMAGES[0]).decode("ascii")],
        "sampling_parameters": json.dumps({"lora_name": "alpha", "max_tokens": MAX_TOKENS}),
    }
    outcome = grpc_one(grpc_url, MODEL, fields)
    prompt = chat_prompt(base, "Describe this image.", images=1)
    completion = reference_text(base, adapters, "alpha", prompt, [IMAGES[0]])
    assert outcome.text == prompt + completion


def _fps(value: float):
    import numpy as np

    return np.array([[value]], dtype=np.float32)


# ---- a good request (also the neighbour of every bad one in test_bad_inputs.py) -----------
@pytest.fixture(scope="module")
def good(qwen2):
    base, adapters = qwen2
    fields = {
        "text_input": "Describe this image.",
        "image": [IMAGES[0]],
        "exclude_input_in_output": True,
        "sampling_parameters": sampling(max_tokens=MAX_TOKENS),
        "return_num_input_tokens": True,
    }
    prompt = chat_prompt(base, "Describe this image.", images=1)
    return fields, reference_text(base, adapters, "beta", prompt, [IMAGES[0]])


# ---- the describe command ------------------------------------------------------------------------
@pytest.mark.parametrize("protocol, stream", [("grpc", False), ("http", True)])
def test_describe_command(grpc_url, http_url, good, tmp_path, capsys, protocol, stream):
    from lora_client.cli import main

    path = tmp_path / "photo.png"
    path.write_bytes(IMAGES[0])
    url = grpc_url if protocol == "grpc" else http_url
    argv = ["describe", str(path), "--prompt", "Describe this image.", "--adapter", "beta"]
    argv += ["--max-tokens", str(MAX_TOKENS), "--url", url, "--protocol", protocol]
    assert main(argv + ["--stream"] * stream) == 0
    assert capsys.readouterr().out == good[1] + "\n"


def test_describe_command_with_video_over_http(http_url, qwen2, tmp_path, capsys):
    from lora_client.cli import main

    base, adapters = qwen2
    frames = video_frames(6)
    paths = []
    for index, frame in enumerate(frames):
        paths.append(tmp_path / f"frame{index}.png")
        paths[-1].write_bytes(frame)
    argv = ["describe", "--video", *map(str, paths), "--video-fps", "2", "--prompt", "Go on."]
    argv += ["--max-tokens", str(MAX_TOKENS), "--url", http_url, "--protocol", "http"]
    assert main(argv) == 0
    prompt = chat_prompt(base, "Go on.", video=True)
    videos = [[rgb(frame) for frame in frames]]
    assert (
        capsys.readouterr().out
        == reference_text(base, adapters, None, prompt, videos=videos) + "\n"
    )


# ---- adapters refused at load --------------------------------------------------------------------
def test_vision_adapter_refused_at_load_when_tower_lora_is_off(grpc_url, demo_models, good):
    """The load fails before any engine starts, naming the ignored modules; Triton keeps the
    model it was serving."""
    client = grpcclient.InferenceServerClient(grpc_url)
    config = client.get_model_config(MODEL, as_json=True)["config"]
    # Triton skips a reload whose config is unchanged, even when new files are given.
    config.setdefault("parameters", {})["variant"] = {"string_value": "tower_lora_off"}
    model_json = json.loads((MODEL_DIR / "1" / "model.json").read_text())
    model_json.update(model=str(demo_models / "qwen2-vl-tiny"), enable_tower_connector_lora=False)
    adapters = {"alpha": str(demo_models / "qwen2-vl-adapters" / "alpha")}
    files = {
        "file:1/model.py": (MODEL_DIR / "1" / "model.py").read_bytes(),
        "file:1/model.json": json.dumps(model_json).encode(),
        "file:1/multi_lora.json": json.dumps(adapters).encode(),
    }
    with pytest.raises(InferenceServerException) as err:
        client.load_model(MODEL, config=json.dumps(config), files=files)
    message = str(err.value)
    assert "vision tower/merger module(s) would be ignored" in message, message
    assert "enable_tower_connector_lora is off" in message and "model.visual." in message
    assert client.is_model_ready(MODEL)
    good_fields, good_text = good
    assert grpc_one(grpc_url, MODEL, good_fields, {"lora_name": "beta"}).text == good_text
