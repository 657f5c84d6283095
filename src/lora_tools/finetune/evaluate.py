"""Held-out domain speech and ordinary speech through the running tritonserver, per adapter.

Everything goes over gRPC with lora_client, as a user's client would send it (`audio_file`,
language "en", greedy). Per adapter (and the base model): WER and domain-term recall on the
held-out sentences, and WER on ordinary speech. The base model's ordinary transcripts are taken
twice, alone and in the same batches as the adapters' requests; they must be identical.
"""

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from lora_tools.finetune.corpus import Split, Utterance, synthesise
from lora_tools.finetune.metrics import Score, score, words

MODEL = "whisper_lora"
BASE = "(base)"
MAX_TOKENS = 96  # a held-out sentence is ~15 tokens; room for a looping adapter to show it


@dataclass(frozen=True)
class AdapterResult:
    name: str  # BASE for the base model
    held_out: Score
    ordinary: Score
    held_out_texts: tuple[str, ...]


@dataclass(frozen=True)
class Evaluation:
    results: tuple[AdapterResult, ...]
    held_out: tuple[Utterance, ...]
    base_alone: tuple[str, ...]  # base on ordinary speech, one request at a time
    base_mixed: tuple[str, ...]  # the same, sent together with the adapters' requests

    @property
    def base_unchanged(self) -> bool:
        return self.base_alone == self.base_mixed

    def result(self, name: str) -> AdapterResult:
        return next(r for r in self.results if r.name == name)


def transcribe(url: str, wav: Path, adapter: str | None) -> str:
    from lora_client.requests import send, transcription_fields

    fields = transcription_fields(wav, language="en", max_tokens=MAX_TOKENS)
    replies = list(send(url, "grpc", MODEL, fields, adapter=adapter))
    return replies[-1].outputs["text_output"][0]


def _transcribe_many(url: str, jobs: list[tuple[Path, str | None]], workers: int) -> list[str]:
    """All jobs in flight together (up to `workers`), so the server batches them."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: transcribe(url, *job), jobs))


def by_adapter(texts: Sequence[str], names: Sequence[str | None]) -> dict:
    """Texts sent sentence by sentence, each to every name in turn -> name: texts in order."""
    if len(texts) % len(names):
        raise ValueError(f"{len(texts)} texts do not divide among {len(names)} adapters")
    return {name: list(texts[index :: len(names)]) for index, name in enumerate(names)}


def check_served(url: str, adapters: Sequence[str]) -> None:
    """Rescan the adapter roots, then fail naming any adapter the server does not serve."""
    from lora_client.requests import adapter_command

    report = adapter_command(url, "grpc", MODEL, "rescan")
    listing = adapter_command(url, "grpc", MODEL, "list")
    served = {item["name"] for item in listing["adapters"]}
    missing = [name for name in adapters if name not in served]
    if missing:
        refused = report.get("refused", {}) | listing.get("refused", {})
        reasons = "; ".join(f"{name}: {refused.get(name, 'not in any root')}" for name in missing)
        raise RuntimeError(f"not served by {MODEL}: {reasons}")


def evaluate(
    url: str,
    adapters: Sequence[str],
    split: Split,
    speech_dir: Path,
    *,
    limit: int | None = None,
    workers: int = 8,
) -> Evaluation:
    """Send the held-out and ordinary sentences (the first `limit` of each) per adapter."""
    check_served(url, adapters)
    held_out = split.held_out[:limit]
    ordinary = split.ordinary[:limit]
    held_wavs = [synthesise(u, speech_dir) for u in held_out]
    ordinary_wavs = [synthesise(u, speech_dir) for u in ordinary]
    names: list[str | None] = [None, *adapters]

    base_alone = [transcribe(url, wav, None) for wav in ordinary_wavs]
    jobs = [(wav, name) for wav in ordinary_wavs + held_wavs for name in names]
    by_name = by_adapter(_transcribe_many(url, jobs, workers), names)

    results = []
    for name in names:
        ordinary_texts = by_name[name][: len(ordinary)]
        held_texts = by_name[name][len(ordinary) :]
        results.append(
            AdapterResult(
                name=name or BASE,
                held_out=score([u.text for u in held_out], held_texts, [u.terms for u in held_out]),
                ordinary=score([u.text for u in ordinary], ordinary_texts, [()] * len(ordinary)),
                held_out_texts=tuple(held_texts),
            )
        )
    base_mixed = by_name[None][: len(ordinary)]
    return Evaluation(tuple(results), tuple(held_out), tuple(base_alone), tuple(base_mixed))


def format_report(evaluation: Evaluation, *, examples: int = 6) -> str:
    held = evaluation.held_out
    terms = sum(len(u.terms) for u in held)
    lines = [
        f"{len(held)} held-out sentences ({terms} domain terms), "
        f"{len(evaluation.base_alone)} ordinary sentences",
        f"{'adapter':<22}{'held-out WER':>14}{'term recall':>14}{'term errors':>13}"
        f"{'ordinary WER':>14}",
    ]
    for result in evaluation.results:
        lines.append(
            f"{result.name:<22}{result.held_out.word_error_rate:>14.1%}"
            f"{result.held_out.term_recall:>14.1%}{result.held_out.term_error_rate:>13.1%}"
            f"{result.ordinary.word_error_rate:>14.1%}"
        )
    verdict = "unchanged" if evaluation.base_unchanged else "CHANGED"
    lines.append(f"base model on ordinary speech, alone vs. batched with the adapters: {verdict}")
    for alone, mixed in zip(evaluation.base_alone, evaluation.base_mixed, strict=True):
        if alone != mixed:
            lines.append(f"  alone: {alone}\n  mixed: {mixed}")
    lines.append("examples (said / per adapter):")
    for index, utterance in enumerate(held[:examples]):
        lines.append(f"  said: {utterance.text}  [{utterance.voice}, {utterance.speed} wpm]")
        for result in evaluation.results:
            text = result.held_out_texts[index]
            mark = "" if words(text) == words(utterance.text) else "  *"
            lines.append(f"    {result.name:<20} {text.strip()}{mark}")
    return "\n".join(lines)
