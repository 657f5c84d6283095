"""Base whisper-base on espeak-ng speech: word error rate, batch rows, language detection.

The sentences go out as padded batch rows (`audio` [N, L] + `audio_length`), 8 per request and
the requests at once, as Triton's Whisper examples send WAV + WAV_LENS. Texts are compared after
Whisper's own English normaliser (transformers' EnglishTextNormalizer), as Whisper's WER figures
are; the voice is espeak-ng's default English one.
"""

import numpy as np
import soundfile

from tests.e2e.triton_calls import grpc_many, grpc_one, sampling

SENTENCES = [
    "She opened the window and listened to the birds singing.",
    "The train to the city leaves early in the morning.",
    "Please put the green book back on the top shelf.",
    "My brother likes to cook pasta on Sunday evenings.",
    "The children played football in the park after school.",
    "It was raining heavily when we arrived at the station.",
    "Could you tell me the way to the nearest post office?",
    "The old man walked slowly along the quiet beach.",
    "We need to buy bread, milk and eggs for breakfast.",
    "The meeting has been moved to next Tuesday afternoon.",
    "Her favorite color is blue, like the summer sky.",
    "The doctor told him to drink more water every day.",
    "They built a small wooden house near the river.",
    "I forgot my umbrella at the restaurant last night.",
    "The museum is closed on Mondays during the winter.",
    "He plays the piano beautifully at every family party.",
    "The cat jumped onto the table and knocked over a glass.",
    "Our teacher asked us to read the first chapter tonight.",
    "The airport was crowded with people going on holiday.",
    "She wrote a long letter to her friend in Canada.",
    "The garden is full of flowers in the spring.",
    "Turn left at the bridge and follow the main road.",
    "The baker sells fresh bread every morning at seven.",
    "We watched the sun go down behind the mountains.",
]
ROWS_PER_REQUEST = 8  # config.pbtxt max_batch_size
VOICE = "en"  # espeak-ng's default English voice


def words(text: str) -> list[str]:
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    return EnglishTextNormalizer({})(text).split()


def word_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """Word-level edit distance over all sentences / reference words (torchaudio's distance)."""
    from torchaudio.functional import edit_distance

    errors = sum(
        edit_distance(words(r), words(h)) for r, h in zip(references, hypotheses, strict=True)
    )
    return errors / sum(len(words(r)) for r in references)


def padded_rows(clips: list[np.ndarray], rate: int) -> dict:
    """Clips of different lengths -> one request: zero-padded `audio` rows + `audio_length`."""
    audio = np.zeros((len(clips), max(len(clip) for clip in clips)), np.float32)
    for row, clip in enumerate(clips):
        audio[row, : len(clip)] = clip
    count = len(clips)
    return {
        "audio": audio,
        "audio_length": np.array([[len(clip)] for clip in clips], np.int32),
        "sample_rate": np.full((count, 1), rate, np.int32),
        "language": np.array([[b"en"]] * count, dtype=object),
        "sampling_parameters": np.array([[sampling(max_tokens=48).encode()]] * count, object),
    }


def test_word_error_rate_on_espeak_sentences(grpc_url, speech):
    clips = []
    for sentence in SENTENCES:
        clip, rate = soundfile.read(speech(sentence, voice=VOICE), dtype="float32")
        clips.append(clip)
    batches = [
        padded_rows(clips[start : start + ROWS_PER_REQUEST], rate)
        for start in range(0, len(clips), ROWS_PER_REQUEST)
    ]
    outcomes = grpc_many(grpc_url, "whisper_lora", [(fields, None) for fields in batches])
    texts = []
    for outcome in outcomes:
        assert outcome.error is None, outcome.error
        assert outcome.outputs["language"] == ["en"] * ROWS_PER_REQUEST
        texts += outcome.outputs["text_output"]
    wer = word_error_rate(SENTENCES, texts)
    print(f"\nword error rate over {len(SENTENCES)} espeak-ng sentences: {wer:.1%}")
    for reference, text in zip(SENTENCES, texts, strict=True):
        if words(reference) != words(text):
            print(f"  said: {reference}\n  got:  {text}")
    assert wer <= 0.15


def test_padding_does_not_change_a_row(grpc_url, speech):
    """A row cut to its audio_length transcribes exactly as the same clip sent alone."""
    short, rate = soundfile.read(speech(SENTENCES[0], voice=VOICE), dtype="float32")
    long, _ = soundfile.read(speech(" ".join(SENTENCES[1:4]), voice=VOICE), dtype="float32")
    batch, alone = grpc_many(
        grpc_url,
        "whisper_lora",
        [
            (padded_rows([long, short], rate), None),
            ({"audio": short, "sample_rate": rate, "language": "en"}, None),
        ],
    )
    assert batch.outputs["text_output"][1] == alone.text
    assert {"train", "shelf", "pasta"} <= set(words(batch.outputs["text_output"][0]))


def test_german_speech_is_detected_as_german(grpc_url, speech):
    wav = speech("Guten Morgen. Ich möchte heute in die Stadt fahren und Brot kaufen.", voice="de")
    outcome = grpc_one(grpc_url, "whisper_lora", {"audio_file": wav.read_bytes()})
    assert outcome.outputs["language"] == ["de"]
    text = outcome.text.lower()
    assert "guten morgen" in text and ("stadt" in text or "brot" in text), text
