"""whisper_lora as a live fleet: an adapter on every layer (encoder, cross-attention k/v,
decoder) dropped into its root at runtime transcribes exactly as its merged reference, next to
the repository's adapters in one batch; a rank over the limit is refused; removal makes it
unknown. Whisper's module check is the one multi_lora.json adapters get (unit-tested with a
refusing check in tests/unit/test_adapter_fleet.py)."""

from tests.conftest import REPO, load_16k, only_with_model
from tests.e2e.test_adapter_fleet import PREFIX, command, publish, retract, served, stable_name
from tests.e2e.triton_calls import grpc_many, sampling

MODEL = "whisper_lora"
ROOT = REPO / "adapters" / MODEL
SENTENCE = "The quick brown fox jumps over the lazy dog."
MAX_TOKENS = 40

pytestmark = only_with_model(MODEL)


def reference(base, adapter, audio) -> str:
    from transformers import AutoTokenizer

    from tests.reference.whisper import reference_generate

    tokenizer = AutoTokenizer.from_pretrained(base)
    prompt = tokenizer.convert_tokens_to_ids(
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
    )
    tokens, _ = reference_generate(base, adapter, audio, prompt, MAX_TOKENS)
    return tokenizer.decode(tokens, skip_special_tokens=True).strip()


def test_runtime_adapter_on_every_layer_matches_its_reference(
    grpc_url, demo_models, speech, tmp_path
):
    from lora_tools.demo.whisper import ALL_LORA_TARGETS, make_whisper_adapters

    base = demo_models / "whisper-base"
    name, too_big = f"{PREFIX}_whisper", f"{PREFIX}_whisper_r32"
    # Built under names without the pid, so every run serves the same weights (seed 78:
    # "a quick round fox jump, so vervee lazy dog.", far from the base transcript).
    fresh_dir, too_big_dir = (tmp_path / stable_name(n) for n in (name, too_big))
    make_whisper_adapters(
        base, tmp_path, names=(fresh_dir.name,), seed=78, targets=ALL_LORA_TARGETS
    )
    make_whisper_adapters(base, tmp_path, names=(too_big_dir.name,), rank=32, seed=1)
    try:
        publish(fresh_dir, name, ROOT)
        publish(too_big_dir, too_big, ROOT)
        report = command(grpc_url, "rescan", MODEL)
        assert "rank 32 exceeds max_lora_rank 16" in report["refused"][too_big]
        assert served(grpc_url, MODEL)[name]["source"] == "root"

        wav = speech(SENTENCE)
        fields = {
            "audio_file": wav.read_bytes(),
            "language": "en",
            "sampling_parameters": sampling(max_tokens=MAX_TOKENS),
        }
        names = [name, "all_layers", None, too_big]
        outcomes = grpc_many(
            grpc_url, MODEL, [(fields, {"lora_name": n} if n else None) for n in names]
        )
        audio = load_16k(wav)
        fresh, repository, plain, refused = outcomes
        assert fresh.text.strip() == reference(base, fresh_dir, audio)
        assert repository.text.strip() == reference(
            base, demo_models / "whisper-adapters" / "all_layers", audio
        )
        assert plain.text.strip() == reference(base, None, audio)
        assert fresh.text != plain.text
        assert f"unknown adapter '{too_big}'" in refused.error
    finally:
        retract(name, ROOT)
        retract(too_big, ROOT)
        command(grpc_url, "rescan", MODEL)
    assert name not in served(grpc_url, MODEL)
