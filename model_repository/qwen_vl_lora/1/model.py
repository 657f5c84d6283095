"""qwen_vl_lora: images + prompt -> text with the LoRA adapter each request names.

The adapter applies to the language model, the vision tower and the merger. Inputs/outputs are
Triton vllm_backend's (`text_input`, `image`, `sampling_parameters`, `stream`, `return_*`, ... ->
`text_output` and the additional outputs asked for: `finish_reason`, `cumulative_logprob`,
`logprobs`, `num_input_tokens`, `num_output_tokens`).
"""

import triton_python_backend_utils as pb_utils  # noqa: F401 - loaded by Triton's stub

from lora_serving.triton.model_host import ModelHost


class TritonPythonModel:
    def initialize(self, args):
        self.host = ModelHost.from_args(args, task="vision_chat")

    def execute(self, requests):
        self.host.submit_all(requests)  # decoupled: answers go through each response sender

    def is_ready(self):
        return self.host.is_ready()

    def finalize(self):
        self.host.close()  # let in-flight requests finish, then stop the engine
