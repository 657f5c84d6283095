"""The bench finds engine processes below a tritonserver whose children come and go."""

import subprocess
import sys
import time

import psutil

from lora_tools.bench.processes import engine_processes

SLEEP = "import time; time.sleep(30)"


def test_a_zombie_child_is_passed_over_not_raised():
    # An unloaded model's stub stays a zombie until tritonserver reaps it; the scan runs then.
    child = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.01)
        with_cmdline = subprocess.Popen([sys.executable, "-c", SLEEP, "whisper_lora_0"])
        try:
            found = engine_processes(psutil.Process().pid, "whisper_lora_0")
            assert found == {"stub": with_cmdline.pid}
        finally:
            with_cmdline.kill()
            with_cmdline.wait()
    finally:
        child.wait()
