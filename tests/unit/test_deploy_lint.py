"""The GPU image, compose file, Kubernetes manifests and deployment scripts pass their linters.

scripts/lint_deploy.sh installs its pinned linters (requirements/lint.txt) on first use into a
cache folder outside the repository, then runs hadolint, the compose-spec schema, strict
Kubernetes schema validation, yamllint and shellcheck, and checks that the GPU lock's inputs,
pyproject's `gpu` extra and the CPU lock's inputs each resolve (uv pip compile).
"""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_deploy_files_pass_their_linters():
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "lint_deploy.sh")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "lint_deploy: all passed" in result.stdout
