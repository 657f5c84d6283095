"""`/metrics` in the endpoint picker's model-server protocol, so the Gateway API Inference
Extension's endpoint picker (llm-d Router) can route to this replica as it routes to vLLM.

The protocol: gateway-api-inference-extension docs/proposals/003-model-server-protocol and
llm-d Router's docs/plugin-metric-protocol.md; its reader is llm-d Router's
`core-metrics-extractor` (v0.10.0: pkg/epp/framework/plugins/datalayer/extractor/metrics).
We publish vLLM's metric names, so the picker's built-in `vllm` engine config reads them
unchanged (k8s/inference-pool.yaml names them explicitly):

  vllm:num_requests_waiting    gauge  requests queued in the engines, both models summed
  vllm:num_requests_running    gauge  requests running in the engines, both models summed
  vllm:kv_cache_usage_perc     gauge  0..1, the fuller engine's KV cache
  vllm:lora_requests_info      gauge  value: Unix time of its last update; labels
      max_lora               LoRA slots per engine (the smaller if the engines differ)
      running_lora_adapters  ids with requests running now, comma-separated, no spaces
      waiting_lora_adapters  ids with requests waiting now, likewise

Ids are the OpenAI `model` field's (`whisper_lora/alpha`), which is what the picker compares
with a request's target model. The picker reads the FIRST series of a plain gauge and the
LoRA series with the LARGEST value, so every family has exactly one series (no per-model
split; one current LoRA series, no old label combinations). Values are the engines' own
scheduler statistics (`lora_openai.engine_load`), never counted here. Unlike vLLM, an adapter
whose requests all wait is listed as waiting only (vLLM lists it in both).
"""

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from lora_openai.engine_load import ServerLoad

# The classic text format (what generate_latest writes for these legacy-valid names), which the
# picker parses with expfmt's TextParser whatever the header says.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
LORA_INFO = "vllm:lora_requests_info"
LORA_LABELS = ("max_lora", "running_lora_adapters", "waiting_lora_adapters")


class _Snapshot:
    """A one-shot prometheus_client collector over one ServerLoad."""

    def __init__(self, load: ServerLoad, updated_at: float):
        self.load, self.updated_at = load, updated_at

    def collect(self):
        load = self.load
        yield GaugeMetricFamily(
            WAITING, "Requests waiting in the engines (both models)", value=load.num_waiting
        )
        yield GaugeMetricFamily(
            RUNNING, "Requests running in the engines (both models)", value=load.num_running
        )
        yield GaugeMetricFamily(
            KV_USAGE, "KV cache usage of the fuller engine, 1 = full", value=load.kv_cache_usage
        )
        if load.max_lora > 0:  # as vLLM: only engines with LoRA publish it
            info = GaugeMetricFamily(
                LORA_INFO, "Running stats on LoRA requests.", labels=LORA_LABELS
            )
            info.add_metric(
                [
                    str(load.max_lora),
                    ",".join(load.adapters("running")),
                    ",".join(load.adapters("waiting")),
                ],
                self.updated_at,
            )
            yield info


def render(load: ServerLoad, updated_at: float) -> bytes:
    """The Prometheus text exposition of `load`; `updated_at` is the LoRA series' value."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(load, updated_at))
    return generate_latest(registry)
