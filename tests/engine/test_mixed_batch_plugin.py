"""Regression test (real engine): a base request batched with adapter requests gets no LoRA delta.

vLLM 0.32 on CPU gives a request without an adapter the last adapter slot's delta when it shares a
batch with adapter requests (upstream PRs 48421, 49656); our general plugin `lora_serving` fixes
it. Each case runs vLLM in a subprocess so that `VLLM_PLUGINS` decides whether the plugin loads,
in that process and in the EngineCore process it spawns. This file is also the subprocess's
script (see `main`).
"""

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

VOCAB_SIZE = 256
PROMPT_TOKEN_IDS = [5, 17, 42, 8, 99, 3, 250, 61]
# Requests are submitted adapters first, base last, and the adapter requests run 4x longer: the
# engine core steps while requests still arrive, so this is what guarantees that every step of the
# base request (prefill included) shares its batch with adapter requests.
BASE_MAX_TOKENS = 8
ADAPTER_MAX_TOKENS = 32
ADAPTER_NAMES = ("adapter1", "adapter2")
PROBE_TIMEOUT_S = 300


@dataclass(frozen=True)
class TinyLoraModel:
    model_dir: Path
    adapter_dirs: dict[str, Path]


@pytest.fixture(scope="session")
def tiny_lora_model(tmp_path_factory) -> TinyLoraModel:
    """A random tiny Qwen2 (head_dim 64, the smallest CPU attention takes) and two adapters.

    No tokenizer: the engine runs with skip_tokenizer_init and token-id prompts (transformers 5
    would swap a home-made tokenizer for Qwen2Tokenizer because of the model type). Weights are
    drawn larger than usual so greedy choices have clear margins (batching must not flip them by
    rounding), and LoRA B is random (PEFT starts it at zero, i.e. no delta).
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    root = tmp_path_factory.mktemp("tiny_lora_model")
    model_dir = root / "base"
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        initializer_range=0.3,
        tie_word_embeddings=True,
        eos_token_id=1,
        bos_token_id=1,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(model_dir)

    adapter_dirs = {}
    lora_config = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=[
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
    )
    for seed, name in enumerate(ADAPTER_NAMES, start=1):
        torch.manual_seed(seed)
        peft_model = get_peft_model(Qwen2ForCausalLM.from_pretrained(model_dir), lora_config)
        with torch.no_grad():
            for param_name, param in peft_model.named_parameters():
                if "lora_B" in param_name:
                    param.normal_(std=0.5)
        adapter_dirs[name] = root / name
        peft_model.save_pretrained(adapter_dirs[name])
    return TinyLoraModel(model_dir, adapter_dirs)


def run_probe(
    model: TinyLoraModel, vllm_plugins: str, tmp_path: Path, spawn_engine_core: bool = False
) -> dict:
    """Run `main` in a fresh interpreter with VLLM_PLUGINS set; return its result. With
    spawn_engine_core the engine core and its worker run in processes of their own, as served."""
    result_path = tmp_path / "result.json"
    env = os.environ | {
        "VLLM_PLUGINS": vllm_plugins,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # lets collective_rpc carry a plain function into the worker (see `main`)
        "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if spawn_engine_core else "0",
    }
    command = [sys.executable, __file__, str(model.model_dir), str(result_path)]
    command += [f"{name}={path}" for name, path in model.adapter_dirs.items()]
    completed = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
    )
    assert completed.returncode == 0, completed.stdout[-5000:] + completed.stderr[-5000:]
    return json.loads(result_path.read_text()) | {"log": completed.stdout + completed.stderr}


def test_with_plugin_mixed_batch_matches_each_request_alone(tiny_lora_model, tmp_path):
    # Spawned as served: the plugin must load in the EngineCore and worker processes vLLM starts.
    result = run_probe(
        tiny_lora_model, vllm_plugins="lora_serving", tmp_path=tmp_path, spawn_engine_core=True
    )

    # Loaded where it matters: the model's worker runs our ops, and EngineCore logged the patch.
    assert result["worker_ops_module"] == "lora_serving.vllm_plugin.cpu_no_lora_index"
    assert re.search(r"\(EngineCore pid=\d+\).*applied cpu_no_lora_index", result["log"])
    alone, mixed = result["alone"], result["mixed"]
    n = len(alone["base"])
    assert alone["base"] not in (alone["adapter1"][:n], alone["adapter2"][:n])  # adapters matter
    assert mixed == alone


def test_without_plugin_base_request_picks_up_an_adapter(tiny_lora_model, tmp_path):
    """The control case: same engine and requests, plugin left out by VLLM_PLUGINS."""
    result = run_probe(tiny_lora_model, vllm_plugins="", tmp_path=tmp_path)

    assert result["worker_ops_module"] == "vllm.lora.ops.torch_ops.lora_ops"
    assert "lora_serving plugin" not in result["log"]
    alone, mixed = result["alone"], result["mixed"]
    assert mixed["base"] != alone["base"]
    # Not just noise: at every step it gets the last slot's adapter, so it decodes as that adapter.
    n = len(mixed["base"])
    assert mixed["base"] in (alone["adapter1"][:n], alone["adapter2"][:n])


def worker_ops_module(worker) -> str:
    """Runs inside the vLLM worker: where the CPU punica wrapper's ops come from."""
    from vllm.lora.punica_wrapper import punica_cpu

    return punica_cpu.bgmv_shrink.__module__


def greedy(max_tokens: int):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)


def main(model_dir: str, result_path: str, *adapters: str) -> None:
    """Subprocess side: greedy tokens of each request alone, then with all submitted at once."""
    from vllm import LLM, TokensPrompt
    from vllm.lora.request import LoRARequest

    llm = LLM(
        model=model_dir,
        dtype="float32",
        enforce_eager=True,
        skip_tokenizer_init=True,
        enable_lora=True,
        max_loras=len(adapters),
        max_lora_rank=8,
        max_model_len=64,
        max_num_seqs=4,
        enable_prefix_caching=False,  # mixed-batch prefill must not reuse the solo run's cache
        seed=0,
    )
    requests = {}  # name -> (LoRA request, sampling params), in submission order
    for lora_int_id, adapter in enumerate(adapters, start=1):
        name, path = adapter.split("=", 1)
        requests[name] = (LoRARequest(name, lora_int_id, path), greedy(ADAPTER_MAX_TOKENS))
    requests["base"] = (None, greedy(BASE_MAX_TOKENS))
    prompt = TokensPrompt(prompt_token_ids=PROMPT_TOKEN_IDS)

    def token_ids(outputs) -> list[list[int]]:
        return [list(output.outputs[0].token_ids) for output in outputs]

    alone = {
        name: token_ids(llm.generate([prompt], params, lora_request=lora))[0]
        for name, (lora, params) in requests.items()
    }
    loras, params = zip(*requests.values(), strict=True)
    batch = llm.generate([prompt] * len(requests), list(params), lora_request=list(loras))
    result = {
        "alone": alone,
        "mixed": dict(zip(requests, token_ids(batch), strict=True)),
        "worker_ops_module": llm.collective_rpc(worker_ops_module)[0],
    }
    Path(result_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
