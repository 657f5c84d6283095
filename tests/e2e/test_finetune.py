"""The fine-tuning path end to end, on the shared tritonserver: train a tiny adapter for a few
steps (LoRA on the top encoder layer, the cross-attention k/v and the decoder), drop it into
whisper_lora's adapter root, and run the evaluation through the server. The served transcripts
equal the merged-weights reference token for token, and the base model's transcripts of
ordinary speech equal the base reference, alone and batched with the adapter's requests."""

from lora_tools.finetune.corpus import build_split, load_16k, synthesise
from lora_tools.finetune.evaluate import MAX_TOKENS, evaluate, format_report
from lora_tools.finetune.train import TrainSettings, train_adapter
from tests.conftest import REPO, only_with_model
from tests.e2e.test_adapter_fleet import PREFIX, command, publish, retract

MODEL = "whisper_lora"
ROOT = REPO / "adapters" / MODEL
SENTENCES = 2  # held-out and ordinary sentences evaluated

pytestmark = only_with_model(MODEL)


def reference(base, adapter, wav) -> str:
    from transformers import AutoTokenizer

    from lora_tools.finetune.train import PROMPT_TOKENS
    from tests.reference.whisper import reference_generate

    tokenizer = AutoTokenizer.from_pretrained(base)
    prompt = tokenizer.convert_tokens_to_ids(list(PROMPT_TOKENS))
    tokens, _ = reference_generate(base, adapter, load_16k(wav), prompt, MAX_TOKENS)
    return tokenizer.decode(tokens, skip_special_tokens=True).strip()


def test_trained_adapter_is_served_as_its_merged_reference(grpc_url, demo_models, tmp_path):
    base = demo_models / "whisper-base"
    speech = tmp_path / "speech"
    split = build_split(seed=0)
    name = f"{PREFIX}_finetuned"
    settings = TrainSettings(kind="all_layers", encoder_layers=1, epochs=3, learning_rate=2e-2)
    report = train_adapter(base, tmp_path / name, split.train[:4], speech, settings, progress=False)
    assert (report.clips, report.windows, report.steps) == (4, 1, 3)
    assert report.last_loss < report.first_loss
    try:
        publish(tmp_path / name, name, ROOT)
        evaluation = evaluate(grpc_url, [name], split, speech, limit=SENTENCES)
        print("\n" + format_report(evaluation))

        trained = evaluation.result(name)
        for utterance, text in zip(evaluation.held_out, trained.held_out_texts, strict=True):
            assert text.strip() == reference(base, tmp_path / name, synthesise(utterance, speech))
        assert trained.held_out_texts != evaluation.result("(base)").held_out_texts

        ordinary = [synthesise(u, speech) for u in split.ordinary[:SENTENCES]]
        alone = [text.strip() for text in evaluation.base_alone]
        assert alone == [reference(base, None, wav) for wav in ordinary]
        assert evaluation.base_unchanged
        assert evaluation.result("(base)").ordinary.word_error_rate <= 0.2
    finally:
        retract(name, ROOT)
        command(grpc_url, "rescan", MODEL)
