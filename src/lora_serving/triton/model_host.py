"""What a model.py delegates to: load settings/adapters/engine, answer requests, shut down.

Request flow: execute -> submit_all: each request is decoded at once (a bad one is answered with
its error and the others go on), then its jobs run on the engine loop; every response goes out
through one ResponseSender, and each request gets exactly one FINAL.
"""

import asyncio
import json
import locale
import traceback
from pathlib import Path

import triton_python_backend_utils as pb_utils

from lora_serving.adapters import AdapterCatalog
from lora_serving.engine.engine_host import EngineHost
from lora_serving.errors import ConfigError, ServingError
from lora_serving.jobs import GenerationJob, RequestPlan
from lora_serving.settings import EngineSettings
from lora_serving.tasks import load_tokenizer, task_class
from lora_serving.triton import tensors
from lora_serving.triton.error_codes import error_response
from lora_serving.triton.response_sender import ResponseSender


class ModelHost:
    def __init__(
        self,
        *,
        model_name: str,
        settings: EngineSettings,
        catalog: AdapterCatalog,
        engine: EngineHost,
        task,
        input_names,
        output_dtypes,
        logger,
    ):
        self.model_name = model_name
        self.settings = settings
        self.catalog = catalog
        self.engine = engine
        self.task = task
        self.input_names = input_names
        self.output_dtypes = output_dtypes
        self.logger = logger
        self.responses = ResponseSender(logger.log_error)

    @classmethod
    def from_args(cls, args: dict, *, task: str) -> "ModelHost":
        # The stub's embedded interpreter starts with an ASCII locale; vLLM reads UTF-8 files.
        locale.setlocale(locale.LC_ALL, "C.UTF-8")
        logger = pb_utils.Logger
        model_config = json.loads(args["model_config"])
        name = model_config["name"]
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException(
                f"model '{name}' streams responses: set "
                "model_transaction_policy { decoupled: true } in its config.pbtxt"
            )
        model_dir = Path(args["model_repository"]) / args["model_version"]
        try:
            settings = EngineSettings.from_file(model_dir / "model.json")
            kind = task_class(task)
            settings = settings.with_engine_args(kind.engine_overrides(settings))
            catalog = AdapterCatalog.from_multi_lora_json(
                settings.multi_lora_path if settings.multi_lora_path.exists() else None,
                enabled=settings.lora_enabled,
                max_lora_rank=settings.max_lora_rank,
                module_check=kind.adapter_module_check(settings),
            )
        except ConfigError as err:
            raise pb_utils.TritonModelException(f"model '{name}' cannot load: {err}") from None
        logger.log_info(f"{name}: adapters {catalog.names or 'none'}; starting the vLLM engine")
        engine = EngineHost(settings, log=logger.log_info)
        engine.start()
        task_impl = kind(settings, catalog, load_tokenizer(settings.engine_args["model"]))
        input_names = tuple(item["name"] for item in model_config["input"])
        output_dtypes = {
            item["name"]: pb_utils.triton_string_to_numpy(item["data_type"])
            for item in model_config["output"]
            if item["name"] in task_impl.output_names
        }
        return cls(
            model_name=name,
            settings=settings,
            catalog=catalog,
            engine=engine,
            task=task_impl,
            input_names=input_names,
            output_dtypes=output_dtypes,
            logger=logger,
        )

    # ---- requests ----------------------------------------------------------------------------
    def submit_all(self, requests) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                plan = self.task.build_plan(tensors.read_request(request, self.input_names))
                self.engine.check_available()  # before any work is queued
            except ServingError as err:
                self.responses.send(sender, error_response(err), final=True)
                continue
            except Exception as err:
                self._log_unexpected(err)
                self.responses.send(sender, error_response(err), final=True)
                continue
            self.engine.submit(self._serve(plan, sender))

    async def _serve(self, plan: RequestPlan, sender) -> None:
        try:
            if plan.stream:
                await self._stream(plan.jobs[0], sender)
            else:
                async with asyncio.TaskGroup() as group:
                    runs = [group.create_task(self._final_chunk(job, sender)) for job in plan.jobs]
                rows = [
                    self.task.render(job, run.result(), stream=False)
                    for job, run in zip(plan.jobs, runs, strict=True)
                ]
                self.responses.send(
                    sender, tensors.to_response(rows, self.output_dtypes), final=True
                )
        except* ServingError as group:
            self.responses.send(sender, error_response(group.exceptions[0]), final=True)
        except* Exception as group:
            self._log_unexpected(group.exceptions[0])
            self.responses.send(sender, error_response(group.exceptions[0]), final=True)

    async def _final_chunk(self, job: GenerationJob, sender):
        last = None
        async for chunk in self.engine.generate(
            job, stream=False, is_cancelled=sender.is_cancelled
        ):
            last = chunk
        return last

    async def _stream(self, job: GenerationJob, sender) -> None:
        async for chunk in self.engine.generate(job, stream=True, is_cancelled=sender.is_cancelled):
            if chunk.finished or chunk.delta:
                row = self.task.render(job, chunk, stream=True)
                self.responses.send(
                    sender, tensors.to_response([row], self.output_dtypes), final=chunk.finished
                )

    def _log_unexpected(self, err: BaseException) -> None:
        trace = "".join(traceback.format_exception(err))
        self.logger.log_error(f"{self.model_name}: unexpected error\n{trace}")

    # ---- lifecycle ---------------------------------------------------------------------------
    def is_ready(self) -> bool:
        return self.engine.is_healthy()

    def close(self) -> None:
        self.engine.close()
        self.responses.close()
