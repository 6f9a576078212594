"""Runs the docs' examples for tests/test_docs.py, each in a process forked from this one.

A fresh ``python example.py`` spends about 2 s importing torch and trainer before the first
line of the example runs; over the hundred-odd examples that was a quarter of the suite. This
server imports the two once, then for each request forks a child that becomes what
``python example.py`` would be: its own working directory, environment, ``sys.argv``,
``sys.path[0]``, warnings filters and output files, ``__name__ == "__main__"``, and a normal
interpreter exit (``atexit`` hooks run). The example imports torch and trainer as usual; they
are already in ``sys.modules``, as nothing else is (trainer imports no optional package).

Protocol: one JSON request per line on stdin (``script``, ``cwd``, ``env``, ``stdout``,
``stderr``, ``timeout``); one JSON line back per request with the child's ``returncode`` (a
negative signal number when it was killed, as ``subprocess``: -14 when it ran past
``timeout``, through ``SIGALRM``).
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import traceback
import warnings
from typing import Any

import torch  # noqa: F401  # imported once here: every example imports it

import trainer  # noqa: F401


def _become_example(request: dict[str, Any]) -> int:
    """In the forked child: set the process up as ``python script`` would, run it."""
    signal.alarm(int(request["timeout"]))  # SIGALRM's default action ends the child
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    script = request["script"]
    sys.argv = [script]
    sys.path[0] = os.path.dirname(script)
    warnings.resetwarnings()
    for option in filter(None, request["env"].get("PYTHONWARNINGS", "").split(",")):
        warnings.simplefilter(option)  # the examples' environment sets "ignore"
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main() -> None:
    responses = os.fdopen(os.dup(1), "w")  # the children's fd 1 becomes their stdout file
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()  # nothing buffered may be copied into the child
        pid = os.fork()
        if pid == 0:
            responses.close()
            sys.exit(_become_example(request))  # the child exits the interpreter normally
        _, status = os.waitpid(pid, 0)
        returncode = os.waitstatus_to_exitcode(status)
        responses.write(json.dumps({"returncode": returncode}) + "\n")
        responses.flush()


if __name__ == "__main__":
    main()
