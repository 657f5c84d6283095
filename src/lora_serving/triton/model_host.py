"""What a model.py delegates to: load settings/adapters/engine, answer requests, shut down.

Request flow: execute -> submit_all: each request's tensors are read at once (a bad one is answered
with its error and the others go on); on the engine loop its plan is built in a planner thread
(media decoding takes seconds for a long file: `task.build_plan`, one job per batch row) and its
jobs run, each driving the engine through a session (`engine.session`, then `job.run(engine)`);
`task.render` turns chunks into output rows; every response goes out
through the request's RequestChannel, which gets exactly one FINAL and is never touched after it
(triton/response_sender.py says why). A request carrying the `adapter_command` input is an
operator's command to the adapter fleet (adapters.control), answered in text_output as JSON.
"""

import asyncio
import concurrent.futures
import gc
import json
import locale
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

import triton_python_backend_utils as pb_utils

from lora_serving import dtype_choice, weights_choice
from lora_serving.adapters import control as adapter_control
from lora_serving.adapters.fleet import AdapterFleet
from lora_serving.engine import lora_slots, recovery
from lora_serving.engine.engine_host import EngineHost
from lora_serving.errors import ConfigError, EngineUnavailable, InvalidRequest, ServingError
from lora_serving.jobs import Job, RequestPlan
from lora_serving.metrics import UNKNOWN_LABEL, RequestRefused
from lora_serving.request_inputs import RawRequest
from lora_serving.settings import EngineSettings
from lora_serving.tasks import load_tokenizer, task_class
from lora_serving.triton import tensors
from lora_serving.triton.error_codes import error_response
from lora_serving.triton.metrics import TritonMetrics
from lora_serving.triton.response_sender import Outbox, RequestChannel

COMMAND_INPUT = "adapter_command"
PLANNER_THREADS = 2
FLEET_START_TIMEOUT_S = 600.0
CLOSED_MESSAGE = "the model was unloaded before this request finished; send it again"
# Three threads of the stub take turns on the GIL: Triton's execute(), the engine loop and the
# response sender. A thread that gives the GIL up for a syscall (every send to Triton, every
# wake-up of the loop) waits up to the switch interval to get it back while the loop is busy;
# at Python's default of 5 ms a streamed response costs up to 5 ms of the sender's time.
GIL_SWITCH_INTERVAL_S = 0.0005


class ModelHost:
    def __init__(
        self,
        *,
        model_name: str,
        settings: EngineSettings,
        fleet: AdapterFleet,
        engine: EngineHost,
        task,
        input_names,
        output_dtypes,
        logger,
        metrics: TritonMetrics,
    ):
        self.model_name = model_name
        self.settings = settings
        self.fleet = fleet
        self.engine = engine
        self.metrics = metrics
        self.task = task
        self.input_names = input_names
        self.output_dtypes = output_dtypes
        self.logger = logger
        self.responses = Outbox(
            logger.log_error, final_flag=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        )
        engine.watch(self._engine_died)
        # Two threads: a long file's decoding holds one, the other plans the requests behind it;
        # at most two requests' decoded media are assembled at once (each bounded by
        # max_audio_seconds). The tokenizer is only read there, as the engine loop reads it.
        self._planner = concurrent.futures.ThreadPoolExecutor(
            PLANNER_THREADS, thread_name_prefix="planner"
        )

    @classmethod
    def from_args(cls, args: dict, *, task: str) -> "ModelHost":
        # The stub's embedded interpreter starts with an ASCII locale; vLLM reads UTF-8 files.
        locale.setlocale(locale.LC_ALL, "C.UTF-8")
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
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
            configured = settings.engine_args.get("dtype")
            settings = settings.with_engine_args(dtype_choice.override(os.environ, configured))
            weights = weights_choice.override(os.environ, settings.int8_model)
            settings = settings.with_engine_args(weights)
            if weights_choice.choice(os.environ) == weights_choice.INT8:
                logger.log_info(
                    f"{name}: int8 weights asked for; loading {settings.engine_args['model']}"
                    + ("" if weights else " (no serving.int8_model: its float weights)")
                )
            kind = task_class(task)
            settings = settings.with_engine_args(kind.engine_overrides(settings))
            settings = settings.with_engine_args(_slot_listing(settings))
            metrics = TritonMetrics(name, logger.log_error)
            fleet, engine = _start(name, settings, kind, metrics, logger)
        except ConfigError as err:
            raise pb_utils.TritonModelException(f"model '{name}' cannot load: {err}") from None
        task_impl = kind(settings, fleet, load_tokenizer(settings.engine_args["model"]))
        input_names = tuple(item["name"] for item in model_config["input"])
        output_dtypes = {
            item["name"]: pb_utils.triton_string_to_numpy(item["data_type"])
            for item in model_config["output"]
            if item["name"] in task_impl.output_names
        }
        return cls(
            model_name=name,
            settings=settings,
            fleet=fleet,
            engine=engine,
            task=task_impl,
            input_names=input_names,
            output_dtypes=output_dtypes,
            logger=logger,
            metrics=metrics,
        )

    # ---- requests ----------------------------------------------------------------------------
    def submit_all(self, requests) -> None:
        jobs = []
        try:
            for request in requests:
                channel = self.responses.channel(request)
                try:
                    raw = tensors.read_request(request, self.input_names)
                    if raw.has(COMMAND_INPUT):
                        self._submit_command(raw, channel)
                        continue
                    self.engine.check_available()  # before any work is queued
                except Exception as err:
                    self._refuse(err, channel)
                    continue
                jobs.append(self._plan_then_serve(raw, channel, _timeout_s(request)))
        finally:  # the requests taken so far run even if a later one raises
            self.engine.submit_all(jobs)

    def _refuse(self, err: Exception, channel: RequestChannel) -> None:
        if not isinstance(err, ServingError):
            self._log_unexpected(err)
        self.metrics.record(RequestRefused(UNKNOWN_LABEL))
        channel.send(error_response(err), final=True)

    async def _plan_then_serve(self, raw: RawRequest, channel: RequestChannel, timeout_s) -> None:
        # Planning decodes the request's media (an audio file at the duration limit takes
        # seconds): in a planner thread, so that neither execute() (Triton's next batch) nor
        # the engine loop (every other request's outputs) waits for it.
        try:
            plan = await asyncio.get_running_loop().run_in_executor(
                self._planner, self.task.build_plan, raw
            )
        except Exception as err:
            self._refuse(err, channel)
            return
        await self._serve(plan, channel, timeout_s)

    # ---- adapter commands --------------------------------------------------------------------
    def _submit_command(self, raw: RawRequest, channel: RequestChannel) -> None:
        try:
            others = sorted(name for name in raw.tensors if name != COMMAND_INPUT)
            if others:
                raise InvalidRequest(
                    f"an {COMMAND_INPUT} request carries no other inputs: {others}"
                )
            if raw.batch_size != 1:
                raise InvalidRequest(f"send one {COMMAND_INPUT} per request")
            adapters = self.settings.serving.adapters
            command = adapter_control.parse_command(
                raw.string(COMMAND_INPUT, 0) or "",
                control=adapters.control,
                token=adapter_control.ControlToken.from_environment(adapters.control_token_env),
                presented=raw.parameters.get(adapter_control.TOKEN_PARAMETER),
            )
            self.engine.check_available()
        except ServingError as err:
            channel.send(error_response(err), final=True)
            return
        self.engine.submit(self._command(command, channel))

    async def _command(self, command: adapter_control.AdapterCommand, channel) -> None:
        try:
            answer = await adapter_control.run_command(self.fleet, command)
            row = {"text_output": json.dumps({"model": self.model_name, **answer})}
            dtypes = {"text_output": self.output_dtypes["text_output"]}
            channel.send(tensors.to_response([row], dtypes), final=True)
        except ServingError as err:
            channel.send(error_response(err), final=True)
        except Exception as err:
            self._log_unexpected(err)
            channel.send(error_response(err), final=True)

    async def _serve(self, plan: RequestPlan, channel: RequestChannel, timeout_s) -> None:
        try:
            if plan.stream:
                await self._stream(plan.jobs[0], channel, timeout_s)
            else:
                async with asyncio.TaskGroup() as group:
                    runs = [
                        group.create_task(self._final_chunk(job, channel, timeout_s))
                        for job in plan.jobs
                    ]
                rows = [
                    self.task.render(job, run.result(), stream=False)
                    for job, run in zip(plan.jobs, runs, strict=True)
                ]
                channel.send(tensors.to_response(rows, self.output_dtypes), final=True)
        except* ServingError as group:
            channel.send(error_response(group.exceptions[0]), final=True)
        except* Exception as group:
            self._log_unexpected(group.exceptions[0])
            channel.send(error_response(group.exceptions[0]), final=True)

    async def _final_chunk(self, job: Job, channel, timeout_s: float | None):
        last = None
        async for chunk in self._run(job, channel, timeout_s, stream=False):
            last = chunk
        return last

    async def _stream(self, job: Job, channel, timeout_s: float | None) -> None:
        async for chunk in self._run(job, channel, timeout_s, stream=True):
            if chunk.finished or chunk.delta:
                row = self.task.render(job, chunk, stream=True)
                response = tensors.to_response([row], self.output_dtypes)
                channel.send(response, final=chunk.finished)

    async def _run(self, job: Job, channel, timeout_s: float | None, *, stream: bool):
        """The job drives the engine: its own `run` makes the engine requests it needs."""
        async with self.engine.session(
            job.adapter, stream=stream, is_cancelled=channel.is_cancelled, timeout_s=timeout_s
        ) as engine:
            async for chunk in job.run(engine):
                yield chunk

    def _log_unexpected(self, err: BaseException) -> None:
        trace = "".join(traceback.format_exception(err))
        self.logger.log_error(f"{self.model_name}: unexpected error\n{trace}")

    # ---- lifecycle ---------------------------------------------------------------------------
    def is_ready(self) -> bool:
        """Called by Triton servers that support a model's own readiness (python_backend 26.03
        and later); Triton 2.51 never asks, hence `_engine_died`."""
        return self.engine.is_healthy()

    def _engine_died(self, error) -> None:
        """The engine is gone: every request now fails with UNAVAILABLE. Triton 2.51's Python
        backend has no way for a model to say it is not ready, so the model unloads itself
        (Triton then reports it not ready and refuses its requests), or, where it cannot, stops
        the server for its supervisor to restart (engine/recovery.py)."""
        self.logger.log_error(
            f"{self.model_name}: the vLLM engine died ({error}); unloading the model. "
            "Load it again through Triton's repository API to recover."
        )
        threading.Thread(target=self._recover, name="engine-recovery", daemon=True).start()

    def _recover(self) -> None:
        action, why = recovery.after_engine_death(
            lambda: pb_utils.unload_model(self.model_name),
            exit_on_engine_death=self.settings.serving.exit_on_engine_death,
        )
        if action is recovery.Recovery.STOP_SERVER:
            self.logger.log_error(
                f"{self.model_name}: could not unload itself ({why}); stopping tritonserver so "
                "that its supervisor restarts it (serving.exit_on_engine_death)"
            )
            os.kill(os.getppid(), signal.SIGTERM)  # the stub's parent is tritonserver
        elif action is recovery.Recovery.KEEP_FAILING:
            self.logger.log_error(
                f"{self.model_name}: could not unload itself ({why}); its requests fail with "
                "UNAVAILABLE until the server restarts"
            )

    def close(self) -> None:
        try:
            self.engine.submit(self.fleet.stop()).result(timeout=10)
        except Exception as err:  # closing anyway
            self.logger.log_warn(f"{self.model_name}: stopping adapter rescans: {err!r}")
        self.engine.close()
        self._planner.shutdown(wait=False, cancel_futures=True)
        self.fleet.close()
        self.responses.close(lambda: error_response(EngineUnavailable(CLOSED_MESSAGE)))
        self.metrics.close()
        # Response senders still referenced from old tracebacks must go while the stub can
        # release them: collected at interpreter exit, they crash the stub (seen after an
        # engine death).
        gc.collect()


def _start(name: str, settings: EngineSettings, kind, metrics: TritonMetrics, logger):
    """Check every adapter, start the engine, load the adapters into it: (fleet, engine).

    ConfigError (a bad multi_lora.json adapter) fails the load; nothing is left running.
    """
    fleet = AdapterFleet.from_settings(
        settings,
        label=name,
        module_check=kind.adapter_module_check(settings),
        log=logger.log_info,
        warn=logger.log_warn,
        metrics=metrics,
    )
    engine = None
    try:
        fleet.prepare()  # before the engine starts: a bad adapter costs no engine start
        logger.log_info(f"{name}: starting the vLLM engine")
        engine = EngineHost(settings, log=logger.log_info, leases=fleet, metrics=metrics)
        engine.start()
        engine.submit(fleet.start(engine)).result(timeout=FLEET_START_TIMEOUT_S)
    except BaseException:
        if engine is not None:
            engine.close(drain_timeout_s=0)
        fleet.close()
        metrics.close()
        raise
    logger.log_info(f"{name}: serving adapters {sorted(fleet.names) or 'none'}")
    return fleet, engine


def _timeout_s(request) -> float | None:
    """The client's own request timeout (microseconds in Triton's protocol), if it set one."""
    try:
        timeout_us = request.timeout()
    except Exception:  # not offered by this backend version
        return None
    return timeout_us / 1e6 if timeout_us else None


def _slot_listing(settings: EngineSettings) -> dict:
    """Let the listing tell adapters in the engine's LoRA slots from cached ones."""
    if not settings.lora_enabled or settings.engine_args.get("worker_extension_cls"):
        return {}
    return {"worker_extension_cls": lora_slots.EXTENSION}
