"""openai-whisper's own subtitle writers (whisper.utils.WriteSRT / WriteVTT) on given results.

Runs in openai-whisper's environment (scripts/openai_whisper.sh). stdin: a JSON list of
{"result": transcribe()-shaped dict, "options": writer options}; stdout: a JSON list of
{"srt": text, "vtt": text}, as `whisper --output_format srt|vtt` would write them.
"""

import io
import json
import sys

from whisper.utils import WriteSRT, WriteVTT


def written(writer_class, result: dict, options: dict) -> str:
    out = io.StringIO()
    writer_class(".").write_result(result, out, options)
    return out.getvalue()


def main() -> None:
    cases = json.load(sys.stdin)
    json.dump(
        [
            {
                "srt": written(WriteSRT, case["result"], case["options"]),
                "vtt": written(WriteVTT, case["result"], case["options"]),
            }
            for case in cases
        ],
        sys.stdout,
    )


if __name__ == "__main__":
    main()
