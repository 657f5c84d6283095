"""The runtime package's import boundary, read from the source (no imports run).

Only lora_serving.triton may import Triton's Python backend (the core must run without it), and
lora_serving holds only what tritonserver and lora-openai load: it never imports the tooling
(lora_tools) or the tests."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "lora_serving"
# reference/ judges the product and is leaving the package for tests/ (issue 30).
NOT_RUNTIME = {"reference"}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports; `from a import b` counts as a and as a.b (b may be one)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_only_the_triton_package_imports_pb_utils(path):
    uses_triton = "triton_python_backend_utils" in imported_modules(path)
    inside = path.relative_to(SRC).parts[0] == "triton"
    assert not uses_triton or inside, f"{path} imports triton_python_backend_utils"


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(SRC.rglob("*.py")) if p.relative_to(SRC).parts[0] not in NOT_RUNTIME],
    ids=lambda p: str(p.relative_to(SRC)),
)
def test_runtime_never_imports_tooling_or_tests(path):
    tooling = {
        name for name in imported_modules(path) if name.split(".")[0] in {"lora_tools", "tests"}
    }
    assert not tooling, f"{path} imports {sorted(tooling)}"


def served_model_py(repository: Path, model: str) -> Path:
    """model_repository_gpu/ has no model.py of its own: the image copies model_repository's
    (docker/Dockerfile; test_deploy_models checks the copy)."""
    own = repository / model / "1" / "model.py"
    return own if own.exists() else SRC.parents[1] / "model_repository" / model / "1" / "model.py"


@pytest.mark.parametrize("repository", ["model_repository", "model_repository_gpu"])
def test_model_py_files_stay_thin(repository):
    root = SRC.parents[1] / repository
    models = sorted(config.parent.name for config in root.glob("*/config.pbtxt"))
    assert models, f"no models in {root}"
    for model in models:
        model_py = served_model_py(root, model)
        assert len(model_py.read_text().splitlines()) < 60, model_py


def folder_of(path: Path) -> str:
    return path.relative_to(SRC).parts[0]


@pytest.mark.parametrize(
    "path", sorted((SRC / "tasks").rglob("*.py")), ids=lambda p: str(p.relative_to(SRC))
)
def test_tasks_drive_the_engine_through_the_session_protocol_only(path):
    """A request's path reads forward: the tasks build jobs that drive jobs.EngineSession; they
    never reach into the engine host, Triton's glue or the adapter fleet (AdapterResolver is
    what they use of the adapters)."""
    reached = {
        name
        for name in imported_modules(path)
        if name.startswith(
            ("lora_serving.engine", "lora_serving.triton", "lora_serving.adapters.fleet")
        )
    }
    assert not reached, f"{path} imports {sorted(reached)}"


@pytest.mark.parametrize(
    "path", sorted((SRC / "engine").rglob("*.py")), ids=lambda p: str(p.relative_to(SRC))
)
def test_the_engine_never_calls_back_into_a_task(path):
    tasks = {name for name in imported_modules(path) if name.startswith("lora_serving.tasks")}
    assert not tasks, f"{path} imports {sorted(tasks)}"


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(SRC.rglob("*.py")) if folder_of(p) not in NOT_RUNTIME],
    ids=lambda p: str(p.relative_to(SRC)),
)
def test_no_runtime_file_over_400_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= 400, f"{path} has {lines} lines: split it by concern"
