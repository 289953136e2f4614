"""A parent process that dies in two steps, as a supervisor with a second thread does
(tests/acceptance/test_processes.py).

    python -m tests.acceptance.parent_of_two_threads COMMAND...

A thread of its own starts COMMAND, with the parent-death signal the supervisor
arranges, and prints the child's pid. At the first line on stdin that thread ends:
the child passes to the main thread, and Linux sends it the signal. At the second line
the process exits: the child passes to init and gets the signal again.

It starts the child with its own ``subprocess.Popen``, not through tests/processes.py:
the point is a child started from a thread of its own with the supervisor's
parent-death signal, which the tests' harness (a test's child, not a grandchild) does
not arrange. The child writes to this process's stdout and stderr, files of the harness.
"""

from __future__ import annotations

import subprocess
import sys
import threading

from ferryq.worker.supervisor import _stop_with_parent


def main() -> None:
    first = threading.Event()

    def start() -> None:
        child = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL,
                                 preexec_fn=_stop_with_parent())  # fmt: skip
        print(child.pid, flush=True)
        first.wait()

    starter = threading.Thread(target=start)
    starter.start()
    sys.stdin.readline()
    first.set()
    starter.join()
    sys.stdin.readline()


if __name__ == "__main__":
    main()
