"""vision_chat task: request inputs -> prompt + media job, every refusal named; no engine."""

import base64
import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from lora_client.requests import as_batch_array
from PIL import Image
from safetensors.numpy import load_file, save_file

from lora_serving import vision
from lora_serving.adapters.catalog import AdapterCatalog, load_adapter
from lora_serving.errors import ConfigError, InvalidRequest
from lora_serving.request_inputs import RawRequest
from lora_serving.settings import EngineSettings, ServingOptions
from lora_serving.tasks import load_tokenizer
from lora_serving.tasks.vision_chat import VisionChatTask, VisionOptions, item_limit
from tests.conftest import DEMO

BASE = DEMO / "qwen2-vl-tiny"
ADAPTERS = DEMO / "qwen2-vl-adapters"


def png(size=(40, 30), color=(200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "PNG")
    return buffer.getvalue()


def zero_width_png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", 0, 10, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def settings(task=None, **engine_args) -> EngineSettings:
    args = {
        "model": str(BASE),
        "limit_mm_per_prompt": {"image": 4, "video": 1},
        "enable_lora": True,
        "enable_tower_connector_lora": True,
        **engine_args,
    }
    return EngineSettings(
        engine_args=args,
        environment={},
        serving=ServingOptions(task=task or {}),
        model_dir=Path("."),
    )


@pytest.fixture(scope="module")
def tokenizer(demo_models):
    return load_tokenizer(str(BASE))


@pytest.fixture(scope="module")
def catalog(demo_models):
    adapters = [
        load_adapter(name, ADAPTERS / name, position, max_lora_rank=16)
        for position, name in enumerate(("alpha", "beta"), start=1)
    ]
    return AdapterCatalog(adapters, enabled=True)


def make_task(tokenizer, catalog, **kwargs) -> VisionChatTask:
    return VisionChatTask(settings(**kwargs), catalog, tokenizer)


def request(parameters=None, **fields) -> RawRequest:
    tensors = {name: as_batch_array(value) for name, value in fields.items()}
    return RawRequest(tensors, parameters or {})


def only_job(task, raw):
    plan = task.build_plan(raw)
    assert len(plan.jobs) == 1
    return plan.jobs[0]


# ---- prompts and media -------------------------------------------------------------------------
def test_images_then_video_then_text_in_the_chat_prompt(tokenizer, catalog):
    task = make_task(tokenizer, catalog)
    frames = [png((56, 42), (i * 40, 0, 0)) for i in range(3)]
    fps = np.array([[4.0]], np.float32)
    job = only_job(
        task, request(text_input="What?", image=[png(), png()], video=frames, video_fps=fps)
    )
    prompt = job.prompt["prompt"]
    image_pad, video_pad = prompt.index("<|image_pad|>"), prompt.index("<|video_pad|>")
    assert prompt.count("<|image_pad|>") == 2 and image_pad < video_pad < prompt.index("What?")
    assert prompt.endswith("<|im_start|>assistant\n")
    media = job.prompt["multi_modal_data"]
    assert [image.size for image in media["image"]] == [(40, 30), (40, 30)]
    ((array, metadata),) = media["video"]
    assert array.shape == (3, 42, 56, 3) and array.dtype == np.uint8
    assert array[1, 0, 0].tolist() == [40, 0, 0]  # frames stay in order
    assert metadata == vision.video_metadata(3, 4.0)
    assert metadata["fps"] == 4.0 and metadata["frames_indices"] == [0, 1, 2]


def test_video_metadata_matches_the_reference_helper():
    from lora_tools.demo.qwen_vl import video_metadata

    assert vision.video_metadata(5, 2.5) == video_metadata(5, 2.5)


def test_vllm_backend_request_shape(tokenizer, catalog):
    """Base64 image string + sampling_parameters holding lora_name, nothing of ours."""
    task = make_task(tokenizer, catalog)
    raw = request(
        text_input="Describe.",
        image=[base64.b64encode(png()).decode()],
        sampling_parameters=json.dumps({"lora_name": "beta", "max_tokens": 5}),
    )
    job = only_job(task, raw)
    assert job.adapter.name == "beta" and job.sampling["max_tokens"] == 5
    assert job.prompt["multi_modal_data"]["image"][0].size == (40, 30)
    assert (job.prompt_text, job.exclude_input) == (job.prompt["prompt"], False)
    assert (job.outputs, job.logprobs_asked) == (frozenset(), False)


def test_vllm_backend_ci_shape_string_values_and_parameters(tokenizer, catalog):
    """Its CI: {"temperature": "0", "top_p": "1"} in the input and as request parameters, plus
    return_* inputs; request parameters alone carry the settings when the input is absent."""
    task = make_task(tokenizer, catalog)
    given = {"temperature": "0", "top_p": "1"}
    job = only_job(
        task,
        request(
            given,
            text_input="In this example,",
            sampling_parameters=json.dumps({**given, "logprobs": 2}),
            return_finish_reason=True,
            return_logprobs=True,
            return_num_output_tokens=False,
        ),
    )
    assert job.sampling == {"temperature": 0, "top_p": 1, "logprobs": 2, "max_tokens": 128}
    assert job.outputs == {"finish_reason", "logprobs"}
    assert job.logprobs_asked is True
    job = only_job(task, request({**given, "lora_name": "alpha", "max_tokens": 3}, text_input="x"))
    assert job.adapter.name == "alpha"
    assert job.sampling == {"temperature": 0, "top_p": 1, "max_tokens": 3}


def test_cumulative_logprob_turns_vllm_logprobs_on(tokenizer, catalog):
    task = make_task(tokenizer, catalog)
    job = only_job(task, request(text_input="x", return_cumulative_logprob=True))
    assert job.sampling["logprobs"] == 0 and job.logprobs_asked is False


def test_structured_outputs_reach_the_job(tokenizer, catalog):
    task = make_task(tokenizer, catalog)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    raw = request(
        text_input="x",
        sampling_parameters=json.dumps({"structured_outputs": json.dumps({"json": schema})}),
    )
    assert only_job(task, raw).sampling["structured_outputs"] == {"json": schema}


def test_raw_prompt_with_placeholders_is_sent_as_is(tokenizer, catalog):
    task = make_task(tokenizer, catalog)
    text = "<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|video_pad|><|vision_end|>"
    job = only_job(
        task,
        request(text_input=text, image=[png()], video=[png()], apply_chat_template=False),
    )
    assert job.prompt["prompt"] == text


@pytest.mark.parametrize(
    "fields, parameters, message",
    [
        ({"text_input": "x", "image": [png()] * 5}, None, "5 images; .* at most 4 per prompt"),
        ({"text_input": "  "}, None, "empty request"),
        ({"text_input": "", "image": []}, None, "empty request"),
        ({"text_input": "x", "image": [b""]}, None, r"image\[0\] is empty"),
        ({"text_input": "x", "image": [zero_width_png()]}, None, r"image\[0\] has zero size"),
        ({"text_input": "x", "image": [b"\x89PNG\r\n\x1a\nrubbish"]}, None, "could not be decoded"),
        ({"text_input": "x", "image": ["!!not base64!!"]}, None, "nor valid base64"),
        ({"text_input": "x", "image": [png((1000, 2))]}, None, "aspect ratio is over 200"),
        (
            {"text_input": "<|image_pad|> what?", "apply_chat_template": False},
            None,
            r"1 <\|image_pad\|> placeholder\(s\) but the request carries 0 image",
        ),
        (
            {"text_input": "no placeholder", "video": [png()], "apply_chat_template": False},
            None,
            r"0 <\|video_pad\|> placeholder\(s\) but the request carries 1 video",
        ),
        ({"text_input": "x", "video": [png()] * 17}, None, "17 frames; at most 16"),
        (
            {"text_input": "x", "video": [png((40, 30)), png((30, 40))]},
            None,
            r"frame\[1\] is 30x40 but frame\[0\] is 40x30",
        ),
        (
            {"text_input": "x", "video": [png()], "video_fps": np.zeros((1, 1), np.float32)},
            None,
            "video_fps must be > 0",
        ),
        ({"text_input": "x", "sampling_parameters": "{not json"}, None, "not valid JSON"),
        ({"text_input": "x"}, {"lora_name": "gamma"}, "unknown adapter 'gamma'"),
        (
            {"text_input": "x", "stream": True, "exclude_input_in_output": False},
            None,
            "exclude_input_in_output=false cannot be streamed",
        ),
        ({"text_input": "x"}, {"n": 2, "best_of": 3}, "'n' must be 1.*'best_of' is not supported"),
        (
            {"text_input": "x", "sampling_parameters": '{"structured_outputs": {"regex": 1}}'},
            None,
            "'structured_outputs' must be an object",
        ),
    ],
)
def test_bad_requests_are_named(tokenizer, catalog, fields, parameters, message):
    task = make_task(tokenizer, catalog, task={"max_video_frames": 16})
    with pytest.raises(InvalidRequest, match=message):
        task.build_plan(request(parameters, **fields))


def test_video_refused_when_the_model_takes_none(tokenizer, catalog):
    task = make_task(tokenizer, catalog, limit_mm_per_prompt={"image": 4, "video": 0})
    with pytest.raises(InvalidRequest, match="accepts no video"):
        task.build_plan(request(text_input="x", video=[png()]))


# ---- pixel limits ------------------------------------------------------------------------------
def test_pixel_limits_resolve_like_vllm(demo_models):
    assert vision.processor_pixel_limits(BASE, None) == vision.PixelLimits(3136, 50176)
    assert vision.processor_pixel_limits(BASE, None, "video") == vision.PixelLimits(3136, 12544)
    flat = {"max_pixels": 25088, "images_kwargs": {"min_pixels": 6272}}
    assert vision.processor_pixel_limits(BASE, flat) == vision.PixelLimits(6272, 25088)
    scoped = {"max_pixels": 25088, "images_kwargs": {"size": {"longest_edge": 12544}}}
    assert vision.processor_pixel_limits(BASE, scoped).max_pixels == 12544
    assert vision.processor_pixel_limits(BASE, scoped, "video").max_pixels == 25088


def test_resize_off_refuses_images_over_max_pixels(tokenizer, catalog):
    task = make_task(
        tokenizer,
        catalog,
        task={"resize_images": False},
        mm_processor_kwargs={"images_kwargs": {"max_pixels": 12544}},
    )
    assert only_job(task, request(text_input="x", image=[png((112, 112))]))
    with pytest.raises(InvalidRequest, match="113x112 = 12656 pixels, over .* 12544; resizing"):
        task.build_plan(request(text_input="x", image=[png((113, 112))]))
    resizing = make_task(tokenizer, catalog, mm_processor_kwargs={"max_pixels": 12544})
    assert only_job(resizing, request(text_input="x", image=[png((400, 300))]))


def test_task_options_are_checked_all_at_once():
    with pytest.raises(ConfigError) as err:
        VisionOptions.from_settings(
            settings(task={"resize_images": "no", "max_video_frames": 0, "max_frames": 3})
        )
    text = str(err.value)
    assert "unknown serving.task key 'max_frames'" in text
    assert "resize_images must be true or false, got 'no'" in text
    assert "max_video_frames must be an integer > 0, got 0" in text
    assert (
        VisionOptions.from_settings(settings(task={"resize_images": False})).resize_images is False
    )


def test_item_limits_accept_vllm_forms():
    assert item_limit(settings(limit_mm_per_prompt={"image": 2}), "image") == 2
    assert item_limit(settings(limit_mm_per_prompt={"video": {"count": 1}}), "video") == 1
    assert item_limit(settings(limit_mm_per_prompt={}), "video") == 999  # vLLM's default


# ---- adapters with vision weights --------------------------------------------------------------
def language_only_copy(adapter: Path, out: Path) -> Path:
    out.mkdir()
    (out / "adapter_config.json").write_bytes((adapter / "adapter_config.json").read_bytes())
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    kept = {key: value for key, value in tensors.items() if ".visual." not in key}
    assert len(kept) < len(tensors)
    save_file(kept, str(out / "adapter_model.safetensors"))
    return out


def test_vision_weights_refused_when_tower_lora_is_off(demo_models, tmp_path):
    path = tmp_path / "multi_lora.json"
    lm_only = language_only_copy(ADAPTERS / "alpha", tmp_path / "lm_only")
    path.write_text(json.dumps({"alpha": str(ADAPTERS / "alpha"), "lm_only": str(lm_only)}))

    def catalog_for(tower: bool) -> AdapterCatalog:
        return AdapterCatalog.from_multi_lora_json(
            path,
            enabled=True,
            max_lora_rank=16,
            module_check=VisionChatTask.adapter_module_check(
                settings(enable_tower_connector_lora=tower)
            ),
        )

    with pytest.raises(ConfigError) as err:
        catalog_for(tower=False)
    text = str(err.value)
    assert "adapter 'alpha'" in text and "lm_only" not in text
    assert (
        "vision tower/merger module(s) would be ignored because enable_tower_connector_lora" in text
    )
    assert "model.visual.blocks.0.attn.proj" in text
    assert catalog_for(tower=True).names == ["alpha", "lm_only"]
    path.write_text(json.dumps({"lm_only": str(lm_only)}))
    assert catalog_for(tower=False).names == ["lm_only"]
