"""What the two tasks share: adapter choice, sampling parameters, batch rows."""

import json
from typing import Any, Protocol

from lora_serving.adapter_access import AdapterResolver
from lora_serving.adapters.catalog import Adapter, pick_adapter_name
from lora_serving.errors import InvalidRequest
from lora_serving.jobs import GenerationChunk, Job, RequestPlan
from lora_serving.request_inputs import RawRequest
from lora_serving.sampling import Field, parse_sampling_parameters
from lora_serving.settings import EngineSettings


class Task(Protocol):
    """One model kind (transcription, vision chat) behind the shared Triton glue."""

    output_names: tuple[str, ...]

    def build_plan(self, raw: RawRequest) -> RequestPlan:
        """One job per batch row; runs in a planner thread (it decodes the media)."""
        ...

    def render(self, job: Job, chunk: GenerationChunk, *, stream: bool) -> dict[str, Any]:
        """Output name -> value (str or int) for one job's chunk."""
        ...


class RowReader:
    """Per-row decoding shared by the tasks: adapter, sampling parameters, stream flag."""

    def __init__(
        self,
        settings: EngineSettings,
        adapters: AdapterResolver,
        *,
        max_tokens_limit: int,
        sampling_defaults: dict[str, Any],
        task_fields: dict[str, Field] | None = None,
        sampling_from_parameters: bool = False,
    ):
        self.settings = settings
        self.adapters = adapters
        self.max_tokens_limit = max_tokens_limit
        self.sampling_defaults = sampling_defaults
        self.task_fields = task_fields
        # vllm_backend reads the sampling settings from the request parameters when the
        # sampling_parameters input is absent (BLS callers cannot send that input).
        self.sampling_from_parameters = sampling_from_parameters

    def plan(self, raw: RawRequest, make_job) -> RequestPlan:
        """One job per batch row, made by the task's `make_job(raw, row)`."""
        rows = self.rows(raw)
        stream = self.stream_flag(raw, rows)
        return RequestPlan([make_job(raw, row) for row in rows], stream=stream)

    def rows(self, raw: RawRequest) -> range:
        count = raw.batch_size
        limit = self.settings.serving.max_items_per_request
        if count > limit:
            raise InvalidRequest(f"request carries {count} batch rows; at most {limit} allowed")
        return range(count)

    def sampling_and_adapter(self, raw: RawRequest, row: int) -> tuple[dict, Adapter | None]:
        sampling, json_adapter = parse_sampling_parameters(
            self._sampling_text(raw, row),
            defaults=self.sampling_defaults,
            max_tokens_limit=self.max_tokens_limit,
            task_fields=self.task_fields,
        )
        parameter = raw.parameters.get("lora_name")
        if parameter is not None and not isinstance(parameter, str):
            raise InvalidRequest("request parameter 'lora_name' must be a string")
        name = pick_adapter_name(
            ("request parameter lora_name", parameter),
            ("input lora_name", raw.string("lora_name", row)),
            ("sampling_parameters.lora_name", json_adapter),
        )
        return sampling, self.adapters.resolve(name)

    def _sampling_text(self, raw: RawRequest, row: int) -> str | None:
        text = raw.string("sampling_parameters", row)
        if text is not None or not self.sampling_from_parameters:
            return text
        settings = {
            key: value
            for key, value in raw.parameters.items()
            if key != "lora_name" and not key.startswith("triton_")
        }
        return json.dumps(settings) if settings else None

    def stream_flag(self, raw: RawRequest, rows: range) -> bool:
        stream = raw.boolean("stream", 0, default=False)
        if stream and len(rows) > 1:
            raise InvalidRequest("stream=true needs a request with one batch row")
        return stream
