"""openai-whisper's encoder for tests/unit/test_whisper_tokenizer.py; runs in its own environment.

Run with scripts/whisper_tiktoken.sh (tiktoken, and openai-whisper's vocabularies in
$WHISPER_ASSETS), never .venv. stdin: {"vocabulary": "multilingual" | "gpt2", "texts": [...]};
stdout: one list of token ids per text. The encoding is built as openai-whisper's
`whisper.tokenizer.get_encoding` builds it (release 20250625): the .tiktoken ranks and GPT-2's
split pattern; plain text needs none of its special tokens.
"""

import base64
import json
import os
import sys
from pathlib import Path

import tiktoken

PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def encoding(vocabulary: str) -> tiktoken.Encoding:
    path = Path(os.environ["WHISPER_ASSETS"]) / f"{vocabulary}.tiktoken"
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in path.read_text().splitlines() if line)
    }
    return tiktoken.Encoding(
        name=vocabulary, pat_str=PATTERN, mergeable_ranks=ranks, special_tokens={}
    )


def main() -> None:
    request = json.load(sys.stdin)
    encoder = encoding(request["vocabulary"])
    json.dump([encoder.encode_ordinary(text) for text in request["texts"]], sys.stdout)


if __name__ == "__main__":
    main()
