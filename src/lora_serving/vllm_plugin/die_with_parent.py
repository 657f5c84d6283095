"""Engine processes die with the process that started them (not a vLLM defect: a serving need).

vLLM starts its EngineCore (and the EngineCore its workers) as child processes. If the Triton
stub that owns an engine dies without a clean shutdown (a crash, SIGKILL, Triton giving up on
it at exit), the EngineCore and its workers keep running, orphaned, holding memory and cores.
Linux's PR_SET_PDEATHSIG makes the kernel signal a child when its parent goes. It is set in
every process vLLM starts (plugins load in each) except the first one, which has no
multiprocessing parent.
"""

import ctypes
import multiprocessing
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
_armed = False


def apply() -> bool:
    """Arm the parent-death signal in a vLLM child process; False in the top process and
    when already armed."""
    global _armed
    parent = multiprocessing.parent_process()
    if _armed or parent is None or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent.pid:  # the parent died before the signal was armed
        os._exit(1)
    _armed = True
    return True
