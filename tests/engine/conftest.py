"""Engine tests run vLLM's engine core inside the process that makes the engine.

With vLLM's default (VLLM_ENABLE_V1_MULTIPROCESSING=1) an `LLM` on CPU spawns two more
interpreters, the EngineCore and its worker (the CPU platform forces the multiprocessing
executor), each importing torch and vLLM again: a tiny Whisper engine took 25 s to start, 7 s in
process. What these tests check (the model's outputs, the plugin's patches) runs the same code
either way. AsyncLLM (EngineHost in test_whisper_sizes.py) still spawns its engine core, which
then runs the model itself instead of spawning a worker. The served path keeps vLLM's default;
the subprocesses these tests start inherit the setting, except the mixed-batch probe that spawns
as served (test_mixed_batch_plugin.py)."""

import pytest


@pytest.fixture(autouse=True, scope="module")
def engine_core_in_process():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        yield
    # An in-process engine core freezes vLLM's environment reading (envs cache): thaw it so that
    # later tests, and the servers they start, see the environment as it is again.
    from vllm import envs

    envs.disable_envs_cache()
