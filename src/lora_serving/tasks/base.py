"""What the two tasks share: adapter choice, sampling parameters, batch rows."""

from typing import Any, Protocol

from lora_serving.adapters import Adapter, AdapterCatalog, pick_adapter_name
from lora_serving.errors import InvalidRequest
from lora_serving.jobs import GenerationChunk, GenerationJob, RequestPlan
from lora_serving.request_inputs import RawRequest
from lora_serving.sampling import Field, parse_sampling_parameters
from lora_serving.settings import EngineSettings


class Task(Protocol):
    """One model kind (transcription, vision chat) behind the shared Triton glue."""

    output_names: tuple[str, ...]

    def build_plan(self, raw: RawRequest) -> RequestPlan: ...

    def render(self, job: GenerationJob, chunk: GenerationChunk, *, stream: bool) -> dict[str, Any]:
        """Output name -> value (str or int) for one job's chunk."""
        ...


class RowReader:
    """Per-row decoding shared by the tasks: adapter, sampling parameters, stream flag."""

    def __init__(
        self,
        settings: EngineSettings,
        catalog: AdapterCatalog,
        *,
        max_tokens_limit: int,
        sampling_defaults: dict[str, Any],
        task_fields: dict[str, Field] | None = None,
    ):
        self.settings = settings
        self.catalog = catalog
        self.max_tokens_limit = max_tokens_limit
        self.sampling_defaults = sampling_defaults
        self.task_fields = task_fields

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
            raw.string("sampling_parameters", row),
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
        return sampling, self.catalog.resolve(name)

    def stream_flag(self, raw: RawRequest, rows: range) -> bool:
        stream = raw.boolean("stream", 0, default=False)
        if stream and len(rows) > 1:
            raise InvalidRequest("stream=true needs a request with one batch row")
        return stream
