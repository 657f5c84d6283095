"""whisper_lora: speech -> text with the LoRA adapter each request names (parameter `lora_name`).

Inputs: `audio` (FP32 samples, padded rows + `audio_length`) + `sample_rate`, or `audio_file`
(any audio/video file FFmpeg decodes, through PyAV: wav, flac, mp3, ogg, opus, webm, m4a, mp4,
...; bounded by max_audio_seconds); optional `language`, `task`, `prompt`, `timestamps`, `stream`,
`sampling_parameters`, `lora_name`. Outputs per batch row: `text_output`, `language`, `segments`
(JSON). Audio longer than 30 s is decoded in windows and stitched. Decoupled: one response per
request, or a stream of partial texts with `stream`.

Word timestamps (`sampling_parameters` `word_timestamps`: true implies `timestamps`): every
segment of `segments` gets `words`, [{"word", "start", "end", "probability"}] as openai-whisper's
`transcribe(word_timestamps=True)` gives them (the word with its leading space, seconds of the
recording rounded to 2 decimals), and its start/end refined by them; `prepend_punctuations` /
`append_punctuations` as openai-whisper's; `word_timestamps_refine` (default true) trims word
edges to the speech Silero VAD hears, false keeps openai-whisper's timings.
"""

import triton_python_backend_utils as pb_utils  # noqa: F401 - loaded by Triton's stub

from lora_serving.triton.model_host import ModelHost


class TritonPythonModel:
    def initialize(self, args):
        self.host = ModelHost.from_args(args, task="transcription")

    def execute(self, requests):
        self.host.submit_all(requests)  # decoupled: answers go through each response sender

    def is_ready(self):
        return self.host.is_ready()

    def finalize(self):
        self.host.close()  # let in-flight requests finish, then stop the engine
