"""die_with_parent: a process that armed it is killed when its parent dies (real processes)."""

import multiprocessing
import os
import time

import psutil

from lora_serving.vllm_plugin import die_with_parent


def _grandchild(armed) -> None:
    armed.value = int(die_with_parent.apply())
    time.sleep(60)


def _child(pid_out, armed) -> None:
    grandchild = multiprocessing.get_context("spawn").Process(target=_grandchild, args=(armed,))
    grandchild.start()
    pid_out.value = grandchild.pid
    while armed.value < 0:
        time.sleep(0.05)
    os._exit(0)  # dies without stopping its child, as a crashed stub would


def test_the_top_process_is_left_alone():
    assert die_with_parent.apply() is False


def test_an_armed_child_dies_with_its_parent():
    context = multiprocessing.get_context("spawn")
    pid, armed = context.Value("i", 0), context.Value("i", -1)
    child = context.Process(target=_child, args=(pid, armed))
    child.start()
    child.join(60)
    assert armed.value == 1
    try:
        grandchild = psutil.Process(pid.value)
    except psutil.NoSuchProcess:
        return  # already gone
    gone, alive = psutil.wait_procs([grandchild], timeout=10)
    assert not alive, "the grandchild outlived its parent"
