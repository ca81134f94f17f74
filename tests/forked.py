"""Fresh processes for the tests, forked from one that has imported TensorFlow.

Most tests measure in a fresh process: its own allocator, counted from zero,
with the BFC allocator on. Importing TensorFlow and Keras is most of such a
process's time (about 4.5 s of 5-6 here), so a server imports them once and
forks a child per run: the child has what a fresh process has (TensorFlow's
runtime, thread pools and allocators are made at its first op, in the child;
the server never runs one) and runs the code as ``python -c`` would.

Only what TensorFlow reads at its first op may differ between a child and the
server (``TF_CPU_BFC_MEM_LIMIT_IN_MB``, ``TF_NUM_INTEROP_THREADS``, ...).
What it reads when it is imported (``TF_ENABLE_ONEDNN_OPTS`` among them) is
the server's, so a run whose environment differs from the server's in any
other variable is a real subprocess (``run`` decides).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

#: Variables TensorFlow reads when it creates its runtime or allocator (and
#: pytest's name of the running test, which TensorFlow never reads), which a
#: forked child may set for itself.
CHILD_TIME = frozenset({"TF_CPU_BFC_MEM_LIMIT_IN_MB", "TF_NUM_INTEROP_THREADS",
                        "TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS", "PYTEST_CURRENT_TEST"})

SERVER = r"""
import json, os, sys, traceback
import tensorflow, keras
control_in, control_out = sys.stdin.buffer, os.fdopen(os.dup(1), "w")
control_out.write(json.dumps({"ready": True}) + "\n"); control_out.flush()
for line in control_in:
    req = json.loads(line)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            os.environ.update(req["env"])
            for fd, path, mode in ((0, req["stdin"], os.O_RDONLY),
                                   (1, req["stdout"], os.O_WRONLY),
                                   (2, req["stderr"], os.O_WRONLY)):
                new = os.open(path, mode)
                os.dup2(new, fd)
                os.close(new)
            sys.argv = ["-c", *req["argv"]]
            sys.path.insert(0, req["cwd"])
            os.chdir(req["cwd"])
            exec(compile(req["code"], "<string>", "exec"), {"__name__": "__main__"})
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            status = 1
        try:
            sys.stdout.flush(); sys.stderr.flush()
        finally:
            os._exit(status)
    control_out.write(json.dumps({"pid": pid}) + "\n"); control_out.flush()
    _, wait = os.waitpid(pid, 0)
    code = -os.WTERMSIG(wait) if os.WIFSIGNALED(wait) else os.WEXITSTATUS(wait)
    control_out.write(json.dumps({"returncode": code}) + "\n"); control_out.flush()
"""


#: Seconds a server may take to import TensorFlow and Keras.
IMPORT_TIMEOUT_S = 900


class Server:
    """One importing server for an environment (the BFC allocator on)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = dict(env)
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], env=self.env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        # importing TensorFlow the first time after an install (a cold disk,
        # the other tests' processes beside it) may take minutes
        self._line(IMPORT_TIMEOUT_S)

    def _line(self, timeout: float | None) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise subprocess.TimeoutExpired("forked child", timeout)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the test process server ended")
        return json.loads(line)

    def run(self, code: str, args: list[str], env: dict[str, str], stdin: str,
            timeout: float) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory() as tmp:
            paths = {k: Path(tmp) / k for k in ("stdin", "stdout", "stderr")}
            paths["stdin"].write_text(stdin)
            paths["stdout"].touch()
            paths["stderr"].touch()
            extra = {k: v for k, v in env.items() if self.env.get(k) != v}
            self.proc.stdin.write(json.dumps({
                "code": code, "argv": list(args), "env": extra, "cwd": os.getcwd(),
                **{k: str(p) for k, p in paths.items()}}) + "\n")
            self.proc.stdin.flush()
            pid = self._line(60)["pid"]
            try:
                code_ = self._line(timeout)["returncode"]
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                self._line(60)
                raise
            return subprocess.CompletedProcess([sys.executable, "-c", code], code_,
                                               paths["stdout"].read_text(),
                                               paths["stderr"].read_text())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


_servers: dict[tuple, Server] = {}


def _key(env: dict[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k not in CHILD_TIME))


def run(args: list[str], *, env: dict[str, str], input: str | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    """``subprocess.run(args, env=env, input=input, capture_output=True,
    text=True, timeout=timeout)`` for ``args`` of ``[sys.executable, "-c",
    code, *argv]``: a child forked from a server with this environment (one
    is started for each environment that differs in more than ``CHILD_TIME``,
    the first time it is asked for)."""
    if len(args) < 3 or args[0] != sys.executable or args[1] != "-c" or \
            os.environ.get("MEMSCOPE_TESTS_SPAWN"):
        return subprocess.run(args, env=env, input=input, capture_output=True, text=True,
                              timeout=timeout)
    key = _key(env)
    if key not in _servers:
        _servers[key] = Server({k: v for k, v in env.items() if k not in CHILD_TIME})
    return _servers[key].run(args[2], args[3:], env, input or "", timeout)


@atexit.register
def close_all() -> None:
    for server in _servers.values():
        server.close()
    _servers.clear()
