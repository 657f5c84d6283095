"""openai-whisper's own tokenizer layout for tests/unit/test_whisper_tokenizer.py; runs in its
own environment (scripts/whisper_tiktoken.sh), never .venv.

Loads openai-whisper 20250625's `whisper/tokenizer.py` (from $WHISPER_ASSETS, beside the
.tiktoken files it reads from an `assets` folder next to itself) and calls its
`get_tokenizer(multilingual, num_languages=N)`. stdin: {"multilingual": bool, "num_languages": N};
stdout: {"n_vocab": ..., "special": {token: id}, "text": [base64 of each text rank's bytes]}.
"""

import base64
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path


def openai_whisper_tokenizer_module():
    assets = Path(os.environ["WHISPER_ASSETS"])
    folder = Path(tempfile.mkdtemp())
    (folder / "tokenizer.py").write_text((assets / "tokenizer.py").read_text())
    (folder / "assets").symlink_to(assets)
    spec = importlib.util.spec_from_file_location("whisper_tokenizer", folder / "tokenizer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    request = json.load(sys.stdin)
    tokenizer = openai_whisper_tokenizer_module().get_tokenizer(
        multilingual=request["multilingual"], num_languages=request["num_languages"]
    )
    encoding = tokenizer.encoding
    text_ranks = min(encoding._special_tokens.values())
    json.dump(
        {
            "n_vocab": encoding.n_vocab,
            "special": encoding._special_tokens,
            "text": [
                base64.b64encode(encoding.decode_single_token_bytes(rank)).decode()
                for rank in range(text_ranks)
            ],
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
