"""The GPU image build's checks (lora_tools.image_check), on this CPU machine: each wrong base
or lock named, the committed GPU lock passing them."""

from pathlib import Path

from lora_tools.image_check import PLUGIN, cuda_python_problems, problems

REPO = Path(__file__).resolve().parents[2]
GOOD = {
    "vllm": "0.32.0",
    "torch": "2.13.0",
    "numpy": "2.3.5",
    "cuda-python": "13.4.4",
    "cuda-bindings": "13.4.4",
}
ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}


def no_files(dist: str) -> list[str]:
    return [f"{dist.replace('-', '_')}-1.dist-info/METADATA"]


def check(versions=GOOD, python=(3, 12), plugins=None, files=no_files, environ=ENV, numpy=None):
    plugins = {"lora_serving": PLUGIN} if plugins is None else plugins
    return problems(versions, python, plugins, files, environ, numpy)


def test_a_good_image_passes():
    assert check() == []
    assert check(numpy="2.3.5") == []


def test_the_mixed_cuda_python_tree_fails_the_build():
    """The reviewed defect: all-in-one cuda-python 12.6 beside cuda-bindings 13."""
    mixed = {**GOOD, "cuda-python": "12.6.2.post1", "cuda-bindings": "13.5.0"}

    def files(dist):
        own = ["cuda/bindings/runtime.cpython-312-x86_64-linux-gnu.so"]
        return own if dist == "cuda-python" else []

    found = cuda_python_problems(mixed, files)
    assert any("does not match cuda-bindings 13.5.0" in p for p in found), found
    assert any("ships its own cuda/bindings files" in p for p in found), found


def test_every_other_mismatch_is_named():
    found = check(
        versions={**GOOD, "vllm": "0.33.1", "cuda-bindings": None, "cuda-python": None},
        python=(3, 11),
        plugins={},
        environ={},
        numpy="1.26.4",
    )
    text = "\n".join(found)
    for part in (
        "Python 3.11",
        "vllm 0.33.1",
        "cuda-bindings is not installed",
        "numpy 2.3.5, the lock says 1.26.4",
        "entry point lora_serving",
        "VLLM_USE_FLASHINFER_SAMPLER",
    ):
        assert part in text, part


def test_the_committed_gpu_lock_pins_matching_cuda_python_and_bindings():
    pins = dict(
        line.split("==", 1)
        for line in (REPO / "requirements" / "gpu.txt").read_text().splitlines()
        if "==" in line and not line.startswith((" ", "#"))
    )
    versions = {name: pins.get(name) for name in GOOD}
    assert cuda_python_problems(versions, lambda dist: []) == []
    assert not problems(versions, (3, 12), {"lora_serving": PLUGIN}, lambda d: [], ENV)
