"""Usage per API key on the front's /metrics, for charge-back: requests and their status,
audio seconds in, prompt and completion tokens, labelled by key name and model id.

  lora_openai_requests_total{key, model, status}     every answered /v1 request
  lora_openai_audio_seconds_total{key, model}         audio sent to transcription / translation
  lora_openai_prompt_tokens_total{key, model}
  lora_openai_completion_tokens_total{key, model}

`key` is the key entry's name ("(anonymous)" without keys, "(no key)" for a refused caller);
`model` is the model id the request named once it was checked to be in the caller's scope,
"" before that (so a caller's probes never add another tenant's names to the metrics).
"""

from prometheus_client import CollectorRegistry, Counter, generate_latest

ANONYMOUS = "(anonymous)"
NO_KEY = "(no key)"


class Usage:
    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("key", "model")
        self.requests = Counter(
            "lora_openai_requests",
            "Requests answered, by API key, model id and HTTP status",
            (*labels, "status"),
            registry=self.registry,
        )
        self.audio_seconds = Counter(
            "lora_openai_audio_seconds",
            "Seconds of audio received for transcription or translation",
            labels,
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "lora_openai_prompt_tokens", "Prompt tokens served", labels, registry=self.registry
        )
        self.completion_tokens = Counter(
            "lora_openai_completion_tokens",
            "Completion tokens served",
            labels,
            registry=self.registry,
        )

    def request(self, key: str, model: str, status: int) -> None:
        self.requests.labels(key, model, str(status)).inc()

    def audio(self, key: str, model: str, seconds: float) -> None:
        self.audio_seconds.labels(key, model).inc(max(seconds, 0.0))

    def tokens(self, key: str, model: str, prompt: int, completion: int) -> None:
        self.prompt_tokens.labels(key, model).inc(max(prompt, 0))
        self.completion_tokens.labels(key, model).inc(max(completion, 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
