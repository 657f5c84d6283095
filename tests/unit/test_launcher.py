"""What the launcher hands tritonserver (the run's dtype and weights), and what it shows when a
start hangs: the Python stacks of the processes it started."""

import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from lora_serving.launcher import TritonServer


@pytest.mark.parametrize(
    "option, variable, value, callers",
    [
        ("dtype", "LORA_SERVING_DTYPE", "float32", "bfloat16"),
        ("weights", "LORA_SERVING_WEIGHTS", "int8", "float"),
    ],
)
def test_the_launcher_hands_the_runs_choice_to_tritonserver(
    monkeypatch, option, variable, value, callers
):
    seen = {}

    class Recorder:
        def __init__(self, command, env, **kwargs):
            seen.update(env)

    monkeypatch.setattr("lora_serving.launcher.server_command", lambda *a: ["true"])
    monkeypatch.setattr("lora_serving.launcher.subprocess.Popen", Recorder)
    monkeypatch.setenv(variable, callers)
    TritonServer("repo", **{option: value})
    assert seen[variable] == value  # the option wins over the caller's environment
    seen.clear()
    monkeypatch.delenv(variable)
    TritonServer("repo")
    assert variable not in seen


def test_a_given_environment_is_what_tritonserver_starts_from(monkeypatch):
    """The test session takes the server's environment before unit tests run beside its start
    (they monkeypatch os.environ): what they set then must not reach the server."""
    from lora_serving.launcher import CONTROL_TOKEN_VARIABLE

    seen = {}

    class Recorder:
        def __init__(self, command, env, **kwargs):
            seen.update(env)

    monkeypatch.setattr("lora_serving.launcher.server_command", lambda *a: ["true"])
    monkeypatch.setattr("lora_serving.launcher.subprocess.Popen", Recorder)
    taken = {CONTROL_TOKEN_VARIABLE: "token-taken-earlier", "AWS_ENDPOINT_URL": "http://shared"}
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://a-unit-tests-own")
    monkeypatch.setenv(CONTROL_TOKEN_VARIABLE, "a-unit-tests-own")
    TritonServer("repo", environment=taken)
    assert seen["AWS_ENDPOINT_URL"] == "http://shared"
    assert seen[CONTROL_TOKEN_VARIABLE] == "token-taken-earlier"
    assert "LD_LIBRARY_PATH" in seen  # still what the stubs need
    with pytest.raises(ValueError, match=CONTROL_TOKEN_VARIABLE):
        TritonServer("repo", environment={})  # a server whose token no client would know


CHILD = textwrap.dedent(
    """
    import time

    def waiting_for_the_parent_queue():
        time.sleep(120)

    waiting_for_the_parent_queue()
    """
)


def test_python_stacks_name_the_function_each_child_waits_in():
    # A stand-in for tritonserver: a process whose child is a Python program that hangs.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {CHILD!r}])",
        ]
    )
    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(parent.pid).children():
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.1)
        time.sleep(1)  # past the interpreter's start-up
        server = TritonServer.__new__(TritonServer)  # no tritonserver binary needed here
        server.process = parent
        stacks = server.python_stacks()
        assert "waiting_for_the_parent_queue" in stacks, stacks
        assert f"=== pid {psutil.Process(parent.pid).children()[0].pid}:" in stacks
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()
