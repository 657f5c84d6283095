"""The fine-tuning recipe's pure parts: the corpus split, window packing, labels, metrics."""

import re

import numpy as np
import pytest

from lora_tools.finetune.corpus import (
    HELD_OUT_TEMPLATES,
    TERMS,
    TRAIN_TEMPLATES,
    Utterance,
    build_split,
)
from lora_tools.finetune.evaluate import AdapterResult, Evaluation, by_adapter, format_report
from lora_tools.finetune.metrics import edit_distance, score, terms_found, words
from lora_tools.finetune.train import (
    TrainSettings,
    decoder_ids,
    first_lora_encoder_layer,
    lora_targets,
    pack_windows,
)


def _pairs(utterances) -> set[frozenset]:
    return {frozenset(u.terms) for u in utterances if len(u.terms) == 2}


def test_held_out_sentences_templates_and_pairs_never_occur_in_training():
    split = build_split(seed=0)
    train_texts = {u.text for u in split.train}
    assert not train_texts & {u.text for u in split.held_out}
    assert not set(TRAIN_TEMPLATES) & set(HELD_OUT_TEMPLATES)
    assert _pairs(split.held_out) and not _pairs(split.held_out) & _pairs(split.train)
    for utterance in split.held_out:
        for template in TRAIN_TEMPLATES:
            pattern = re.escape(template).replace(r"\{a\}", r"\w+").replace(r"\{b\}", r"\w+")
            assert not re.fullmatch(pattern, utterance.text), utterance.text


def test_every_term_is_trained_and_every_held_out_term_was_trained():
    split = build_split(seed=0)
    trained = {t for u in split.train for t in u.terms}
    assert trained == set(TERMS)
    assert {t for u in split.held_out for t in u.terms} <= trained
    for utterance in split.train + split.held_out:
        assert all(term in utterance.text for term in utterance.terms)
    assert not any(t in u.text for u in split.ordinary for t in TERMS)


def test_split_is_deterministic_and_uses_several_voices_and_speeds():
    assert build_split(seed=3) == build_split(seed=3)
    assert build_split(seed=3) != build_split(seed=4)
    train = build_split(seed=0).train
    assert len({u.voice for u in train}) >= 4 and len({u.speed for u in train}) >= 3
    assert 150 <= len(train) <= 300


def test_utterance_file_name_depends_on_voice_speed_and_text():
    a = Utterance("Take Zorvexa.", ("Zorvexa",), "en", 130)
    assert a.file_name() == Utterance("Take Zorvexa.", ("Zorvexa",), "en", 130).file_name()
    assert a.file_name() != Utterance("Take Zorvexa.", ("Zorvexa",), "en-us", 130).file_name()
    assert a.file_name() != Utterance("Take Zorvexa.", ("Zorvexa",), "en", 145).file_name()


def test_pack_windows_joins_clips_in_order_within_the_limit():
    second = np.ones(16_000, np.float32)
    clips = [(second * i, f"s{i}") for i in range(1, 6)]
    windows = pack_windows(clips, window_seconds=2.5, gap_s=0.25)
    assert [w.text for w in windows] == ["s1 s2", "s3 s4", "s5"]
    assert [len(w.samples) for w in windows] == [36_000, 36_000, 16_000]
    assert windows[0].samples[16_000:20_000].max() == 0  # the gap is silence
    with pytest.raises(ValueError, match="exceeds the window"):
        pack_windows([(np.zeros(48_000, np.float32), "long")], window_seconds=2)


def test_decoder_ids_ignore_the_prompt_and_end_with_end_of_text():
    inputs, labels = decoder_ids([1, 2, 3, 4], [10, 11], end_id=99)
    assert inputs == [1, 2, 3, 4, 10, 11]
    assert labels == [-100, -100, -100, 10, 11, 99]


def test_lora_targets_cover_the_chosen_layers():
    decoder = re.compile(lora_targets("decoder", None, 6))
    assert decoder.fullmatch("model.decoder.layers.0.encoder_attn.q_proj")
    assert not decoder.fullmatch("model.decoder.layers.0.encoder_attn.k_proj")
    assert not decoder.fullmatch("model.encoder.layers.5.fc1")
    top_two = lora_targets("all_layers", 2, 6)
    assert first_lora_encoder_layer(top_two, 6) == 4
    assert re.fullmatch(top_two, "model.encoder.layers.5.self_attn.v_proj")
    assert re.fullmatch(top_two, "model.decoder.layers.3.encoder_attn.k_proj")
    assert not re.fullmatch(top_two, "model.encoder.layers.3.fc2")
    assert first_lora_encoder_layer(lora_targets("all_layers", None, 6), 6) == 0
    assert first_lora_encoder_layer(lora_targets("decoder", None, 6), 6) == 6


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"kind": "encoder"}, "kind must be one of decoder, all_layers"),
        ({"epochs": 0}, "must be positive"),
        ({"threads": 0}, "must be positive"),
        ({"encoder_layers": 0}, "encoder_layers must be >= 1"),
        ({"window_seconds": 31}, "window_seconds must be within 1-30"),
    ],
)
def test_train_settings_refuse_bad_values(fields, message):
    with pytest.raises(ValueError, match=message):
        TrainSettings(**fields)


def test_edit_distance_counts_substitutions_insertions_and_deletions():
    assert edit_distance("a b c".split(), "a b c".split()) == 0
    assert edit_distance("a b c".split(), "a x c".split()) == 1
    assert edit_distance("a b c".split(), "a c".split()) == 1
    assert edit_distance("a b".split(), "a b c d".split()) == 2
    assert edit_distance([], "a b".split()) == 2


def test_words_use_whispers_english_normaliser():
    assert words("Take Zorvexa, twice!") == ["take", "zorvexa", "twice"]


def test_terms_found_counts_each_spoken_term_once():
    assert terms_found(["Zorvexa"], "take zorvexa now") == 1
    assert terms_found(["Zorvexa"], "take Zorvexia now") == 0
    assert terms_found(["Zorvexa", "Zorvexa"], "Zorvexa, not Kyrdalix") == 1
    assert terms_found(["Zorvexa", "Kyrdalix"], "Kyrdalix and Zorvexa.") == 2


def test_score_rates_are_over_all_sentences_together():
    result = score(
        ["Take Zorvexa now.", "Mix Kyrdalix with Lumiphrex."],
        ["Take Zorvexia now.", "Mix Kyrdalix with Lumiphrex."],
        [("Zorvexa",), ("Kyrdalix", "Lumiphrex")],
    )
    assert (result.word_errors, result.reference_words) == (1, 7)
    assert result.word_error_rate == pytest.approx(1 / 7)
    assert (result.terms_found, result.terms_spoken) == (2, 3)
    assert result.term_error_rate == pytest.approx(1 / 3)
    assert score([], [], []).term_recall == 1.0


def test_by_adapter_regroups_sentence_major_texts():
    texts = ["s1 base", "s1 a", "s2 base", "s2 a"]
    assert by_adapter(texts, [None, "a"]) == {None: ["s1 base", "s2 base"], "a": ["s1 a", "s2 a"]}
    with pytest.raises(ValueError, match="do not divide"):
        by_adapter(texts[:3], [None, "a"])


def _evaluation(base_mixed: tuple[str, ...]) -> Evaluation:
    held = build_split(seed=0).held_out[:2]
    said = [u.text for u in held]
    heard = (said[0], said[1].replace(held[1].terms[0], "Something"))
    results = tuple(
        AdapterResult(name, score(said, texts, [u.terms for u in held]), score([], [], []), texts)
        for name, texts in (("(base)", heard), ("pharma", tuple(said)))
    )
    return Evaluation(results, held, ("Hello there.",), base_mixed)


def test_report_lists_each_adapter_and_whether_the_base_output_changed():
    unchanged = _evaluation(("Hello there.",))
    assert unchanged.base_unchanged
    report = format_report(unchanged)
    assert "2 held-out sentences (2 domain terms), 1 ordinary sentences" in report
    assert re.search(r"\(base\)\s+\S+%\s+50\.0%\s+50\.0%", report)
    assert re.search(r"pharma\s+0\.0%\s+100\.0%\s+0\.0%", report)
    assert "batched with the adapters: unchanged" in report

    changed = _evaluation(("Hello, there!",))
    assert not changed.base_unchanged
    assert "CHANGED" in format_report(changed) and "mixed: Hello, there!" in format_report(changed)
