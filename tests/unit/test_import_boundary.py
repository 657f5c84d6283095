"""The import structure, read from the source (no imports run).

Only lora_serving.triton may import Triton's Python backend (the core must run without it);
lora_serving holds only what tritonserver and lora-openai load: it never imports the tooling
(lora_tools) or the tests, and the tooling never imports the tests; the merged-weights reference
(tests/reference) imports none of the product it judges; and lora_serving's folders import each
other one way only (no cycle), so each can be read knowing only those below it."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "lora_serving"
TOOLING = REPO / "src" / "lora_tools"
REFERENCE = REPO / "tests" / "reference"
PRODUCT = {"lora_serving", "lora_tools", "lora_openai", "lora_media", "lora_client"}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function; `from a import b` counts
    as a and as a.b (b may be one); relative imports by their absolute name."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
            module = _absolute(path, node.level, node.module)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _absolute(path: Path, level: int, module: str | None) -> str:
    """`from ..a import b` in path -> the absolute name of ..a (packages end where __init__.py
    files do)."""
    if not level:
        return module
    package = path.parent
    for _ in range(level - 1):
        package = package.parent
    parts = []
    while (package / "__init__.py").is_file():
        parts.insert(0, package.name)
        package = package.parent
    return ".".join(parts + ([module] if module else []))


def python_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def top_names(path: Path, wanted: set[str]) -> list[str]:
    return sorted(name for name in imported_modules(path) if name.split(".")[0] in wanted)


@pytest.mark.parametrize("path", python_files(SRC), ids=lambda p: str(p.relative_to(SRC)))
def test_only_the_triton_package_imports_pb_utils(path):
    uses_triton = "triton_python_backend_utils" in imported_modules(path)
    inside = path.relative_to(SRC).parts[0] == "triton"
    assert not uses_triton or inside, f"{path} imports triton_python_backend_utils"


@pytest.mark.parametrize("path", python_files(SRC), ids=lambda p: str(p.relative_to(SRC)))
def test_runtime_never_imports_tooling_or_tests(path):
    assert not top_names(path, {"lora_tools", "tests"}), path


@pytest.mark.parametrize("path", python_files(TOOLING), ids=lambda p: str(p.relative_to(TOOLING)))
def test_tooling_never_imports_tests(path):
    assert not top_names(path, {"tests"}), path


@pytest.mark.parametrize(
    "path", python_files(REFERENCE), ids=lambda p: str(p.relative_to(REFERENCE))
)
def test_reference_imports_no_product_code(path):
    """A reference that borrowed the product's code would agree with the product's mistakes."""
    assert python_files(REFERENCE), REFERENCE
    assert not top_names(path, PRODUCT), path


def folder_imports(package: Path) -> dict[str, set[str]]:
    """Which of the package's parts each part imports: a part is a top-level module (metrics.py
    -> "metrics") or a folder with everything under it (adapters/ -> "adapters")."""
    name = package.name
    part_of = lambda path: path.relative_to(package).parts[0].removesuffix(".py")  # noqa: E731
    edges: dict[str, set[str]] = {}
    for path in python_files(package):
        if path.relative_to(package).parts == ("__init__.py",):
            continue
        source = part_of(path)
        targets = edges.setdefault(source, set())
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == name and len(parts) > 1 and parts[1] != source:
                if (package / parts[1]).is_dir() or (package / f"{parts[1]}.py").is_file():
                    targets.add(parts[1])
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph as [a, b, ..., a], or [] when it has none (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node], path[len(path) :] = "open", [node]
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = "done"
        path.pop()
        return []

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []  # a diamond is no cycle
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]


def test_folder_imports_are_read_as_parts():
    edges = folder_imports(SRC)
    assert {"adapters", "engine", "tasks", "triton", "vllm_plugin", "metrics"} <= set(edges)
    assert {"adapters", "metrics"} <= edges["engine"] and "errors" in edges["adapters"]


@pytest.mark.parametrize("package", ["lora_serving", "lora_openai", "lora_tools", "lora_media"])
def test_no_import_cycle_between_a_package_s_folders(package):
    cycle = find_cycle(folder_imports(REPO / "src" / package))
    assert not cycle, f"import cycle between {package}'s folders: {' -> '.join(cycle)}"


@pytest.mark.parametrize("repository", ["model_repository", "model_repository_gpu"])
def test_model_py_files_stay_thin(repository):
    root = REPO / repository
    models = sorted(config.parent.name for config in root.glob("*/config.pbtxt"))
    assert models, f"no models in {root}"
    for model in models:
        model_py = served_model_py(root, model)
        assert len(model_py.read_text().splitlines()) < 60, model_py


def served_model_py(repository: Path, model: str) -> Path:
    """model_repository_gpu/ has no model.py of its own: the image copies model_repository's
    (docker/Dockerfile; test_deploy_models checks the copy)."""
    own = repository / model / "1" / "model.py"
    return own if own.exists() else REPO / "model_repository" / model / "1" / "model.py"


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
    python_files(SRC),
    ids=lambda p: str(p.relative_to(SRC)),
)
def test_no_runtime_file_over_400_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= 400, f"{path} has {lines} lines: split it by concern"
