"""The serving stack end to end: real tritonserver, both models, demo adapters, tritonclient."""

import io

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image

from tests.conftest import load_16k
from tests.e2e.triton_calls import grpc_many, grpc_one, http_one, sampling

FOX = "The quick brown fox jumps over the lazy dog."
BIRDS = "She opened the window and listened to the birds singing."
# A sentence each demo adapter hears differently (espeak-ng's en-us voice, whisper-base).
FOREST = "Birds and foxes live in the old forest near the river."
# vllm_backend's additional outputs, on both models: return_<name> inputs, <name> outputs.
ADDITIONAL_OUTPUTS = {
    "finish_reason",
    "cumulative_logprob",
    "logprobs",
    "num_input_tokens",
    "num_output_tokens",
}
RETURN_INPUTS = {f"return_{name}" for name in ADDITIONAL_OUTPUTS}
WHISPER_IO = {
    "inputs": {
        "audio",
        "sample_rate",
        "audio_length",
        "audio_file",
        "language",
        "task",
        "prompt",
        "timestamps",
        "stream",
        "sampling_parameters",
        "lora_name",
        "adapter_command",
        *RETURN_INPUTS,
    },
    "outputs": {"text_output", "language", "segments", *ADDITIONAL_OUTPUTS},
}
QWEN_IO = {
    "inputs": {
        "text_input",
        "image",
        "video",
        "video_fps",
        "system_prompt",
        "apply_chat_template",
        "stream",
        "sampling_parameters",
        "exclude_input_in_output",
        "lora_name",
        "adapter_command",
        *RETURN_INPUTS,
    },
    "outputs": {"text_output", *ADDITIONAL_OUTPUTS},
}


@pytest.mark.parametrize("model, io", [("whisper_lora", WHISPER_IO), ("qwen_vl_lora", QWEN_IO)])
def test_model_ready_with_metadata_over_grpc_and_http(grpc_url, http_url, model, io):
    grpc_client = grpcclient.InferenceServerClient(grpc_url)
    http_client = httpclient.InferenceServerClient(http_url)
    assert grpc_client.is_model_ready(model) and http_client.is_model_ready(model)
    grpc_meta = grpc_client.get_model_metadata(model, as_json=True)
    http_meta = http_client.get_model_metadata(model)
    for meta in (grpc_meta, http_meta):
        assert {item["name"] for item in meta["inputs"]} == io["inputs"]
        assert {item["name"] for item in meta["outputs"]} == io["outputs"]


# ---- whisper_lora ------------------------------------------------------------------------------
def whisper_inputs(wav_path, **extra) -> dict:
    return {
        "audio_file": wav_path.read_bytes(),
        "language": "en",
        "sampling_parameters": sampling(max_tokens=40),
        **extra,
    }


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_whisper_base_transcribes_speech(grpc_url, http_url, speech, protocol):
    wav = speech(BIRDS)
    call = grpc_one if protocol == "grpc" else http_one
    outcome = call(
        grpc_url if protocol == "grpc" else http_url,
        "whisper_lora",
        {"audio_file": wav.read_bytes()},
    )  # no language: detected
    assert outcome.error is None, outcome.error
    words = outcome.text.lower()
    for word in ("opened", "window", "listened", "birds", "singing"):
        assert word in words, outcome.text
    assert outcome.outputs["language"] == ["en"]


def test_whisper_resamples_samples_at_any_rate(grpc_url, speech):
    """22.05 kHz float samples (espeak-ng's rate) are resampled by the server."""
    import soundfile

    samples, rate = soundfile.read(speech(FOX), dtype="float32")
    outcome = grpc_one(
        grpc_url,
        "whisper_lora",
        {"audio": samples.astype(np.float32), "sample_rate": int(rate), "language": "en"},
    )
    assert "lazy dog" in outcome.text.lower(), outcome.text  # "the quick round fox ..." (sic)


@pytest.fixture(scope="module")
def whisper_solo(grpc_url, speech):
    """Each adapter alone (one request at a time), chosen by the request parameter."""
    inputs = whisper_inputs(speech(FOREST))
    return {
        name: grpc_one(grpc_url, "whisper_lora", inputs, {"lora_name": name} if name else None).text
        for name in (None, "alpha", "beta")
    }


def test_whisper_each_adapter_changes_the_output(whisper_solo):
    base, alpha, beta = whisper_solo[None], whisper_solo["alpha"], whisper_solo["beta"]
    assert "forest near the river" in base.lower()
    assert alpha != base and beta != base and alpha != beta, whisper_solo


def test_whisper_adapter_named_by_tensor_or_parameter_is_the_same(grpc_url, speech, whisper_solo):
    by_tensor = grpc_one(
        grpc_url, "whisper_lora", whisper_inputs(speech(FOREST), lora_name="alpha")
    ).text
    assert by_tensor == whisper_solo["alpha"]
    conflict = grpc_one(
        grpc_url,
        "whisper_lora",
        whisper_inputs(speech(FOREST), lora_name="beta"),
        {"lora_name": "alpha"},
    )
    assert "conflicting adapter names" in conflict.error


def test_whisper_unknown_adapter_is_a_clear_error(grpc_url, http_url, speech):
    for call, url in ((grpc_one, grpc_url), (http_one, http_url)):
        outcome = call(url, "whisper_lora", whisper_inputs(speech(FOX)), {"lora_name": "gamma"})
        assert (
            "unknown adapter 'gamma'; available: all_layers, alpha, beta, cross_kv, encoder_only"
            in outcome.error
        )


def test_whisper_mixed_batch_equals_solo_and_merged_reference(
    grpc_url, speech, whisper_solo, demo_models
):
    """{base, alpha, beta} sent together share engine batches and still get their own adapter."""
    from tests.reference.whisper import reference_generate

    wav = speech(FOREST)
    names = [None, "alpha", "beta"] * 2
    outcomes = grpc_many(
        grpc_url,
        "whisper_lora",
        [(whisper_inputs(wav), {"lora_name": n} if n else None) for n in names],
    )
    audio = load_16k(wav)
    tokenizer = _whisper_tokenizer(demo_models)
    prompt = tokenizer.convert_tokens_to_ids(
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
    )
    for name, outcome in zip(names, outcomes, strict=True):
        assert outcome.text == whisper_solo[name], (name, outcome.text, whisper_solo[name])
        adapter = demo_models / "whisper-adapters" / name if name else None
        tokens, _ = reference_generate(demo_models / "whisper-base", adapter, audio, prompt, 40)
        expected = tokenizer.decode(tokens, skip_special_tokens=True).strip()
        assert outcome.text == expected, (name, outcome.text, expected)


def _whisper_tokenizer(demo_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_models / "whisper-base")


# ---- qwen_vl_lora ------------------------------------------------------------------------------
def png(color=(200, 30, 30), size=(96, 64)) -> bytes:
    image = Image.new("RGB", size, color)
    for x in range(0, size[0], 8):  # some structure, so the vision tower has something to see
        for y in range(0, size[1], 8):
            image.putpixel((x, y), (x * 2 % 256, y * 3 % 256, 90))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


PROMPT = "Describe this image."


def qwen_inputs(**extra) -> dict:
    return {
        "text_input": PROMPT,
        "image": [png()],
        "exclude_input_in_output": True,
        "sampling_parameters": sampling(max_tokens=16),
        # vllm_backend's additional outputs, sent only when asked for
        "return_finish_reason": True,
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
        **extra,
    }


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_qwen_image_and_prompt_return_text(grpc_url, http_url, protocol):
    call = grpc_one if protocol == "grpc" else http_one
    outcome = call(grpc_url if protocol == "grpc" else http_url, "qwen_vl_lora", qwen_inputs())
    assert outcome.error is None, outcome.error
    assert outcome.text
    assert outcome.outputs["num_output_tokens"] == [16]
    assert outcome.outputs["finish_reason"] == ["length"]
    assert outcome.outputs["num_input_tokens"][0] > 10


@pytest.fixture(scope="module")
def qwen_solo(grpc_url):
    return {
        name: grpc_one(
            grpc_url, "qwen_vl_lora", qwen_inputs(), {"lora_name": name} if name else None
        ).text
        for name in (None, "alpha", "beta")
    }


def test_qwen_each_adapter_changes_the_output(qwen_solo):
    assert len(set(qwen_solo.values())) == 3, qwen_solo


def test_qwen_streams_deltas_that_add_up(grpc_url, qwen_solo):
    outcome = grpc_one(grpc_url, "qwen_vl_lora", qwen_inputs(stream=True), {"lora_name": "alpha"})
    assert len(outcome.partials) >= 2
    assert "".join(outcome.partials) + outcome.text == qwen_solo["alpha"]


def test_qwen_mixed_batch_equals_solo_and_merged_reference(grpc_url, qwen_solo, demo_models):
    from lora_serving.tasks import load_tokenizer
    from tests.reference.qwen_vl import reference_generate

    names = [None, "alpha", "beta"] * 2
    outcomes = grpc_many(
        grpc_url, "qwen_vl_lora", [(qwen_inputs(), {"lora_name": n} if n else None) for n in names]
    )
    base = demo_models / "qwen2-vl-tiny"
    tokenizer = load_tokenizer(str(base))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    image = Image.open(io.BytesIO(png())).convert("RGB")
    for name, outcome in zip(names, outcomes, strict=True):
        assert outcome.text == qwen_solo[name], (name, outcome.text, qwen_solo[name])
        adapter = demo_models / "qwen2-vl-adapters" / name if name else None
        tokens, _ = reference_generate(base, adapter, prompt, [image], 16)
        assert outcome.text == tokenizer.decode(tokens, skip_special_tokens=True), name
