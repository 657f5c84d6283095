"""Only lora_serving.triton may import Triton's Python backend; the core must run without it."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "lora_serving"


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


def test_model_py_files_stay_thin():
    repo = SRC.parents[1] / "model_repository"
    for model_py in repo.glob("*/1/model.py"):
        assert len(model_py.read_text().splitlines()) < 60, model_py
