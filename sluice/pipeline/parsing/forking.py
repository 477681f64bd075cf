"""The extraction children's process class (``sluice.pipeline.parsing.parse`` starts one per
document), their fork server, and the environment every parsing child gets.

Kept apart and light (only the standard library): a child unpickles its Process object, which
imports this module, and the fork server has it imported already (``parsing.preload``).

A child parses hostile bytes, so it gets only what parsing needs (``child_env``): none of Sluice's
settings or secrets (the console password, the webhook secret, the Chroma token, the database URL
live in the environment of the worker or console that asks). That holds for the fork server too:
its children are forks of it, so its environment is in their memory and their /proc/<pid>/environ.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import threading
from collections.abc import Callable
from multiprocessing import (
    connection,
    forkserver,
    popen_forkserver,
    reduction,
    resource_tracker,
    spawn,
)
from multiprocessing import context as mp_context
from multiprocessing import process as mp_process
from multiprocessing import util as mp_util
from pathlib import Path
from typing import Any

# What a parsing child (the extractor, the decrypter, Tesseract below them) may see of the caller's
# environment: where programs and language data are, the locale and time zone, the temporary
# folder, and the test suite's fault points.
CHILD_ENV_KEYS = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "TESSDATA_PREFIX",
    "OMP_THREAD_LIMIT",
    "SLUICE_FAULTS",
)


def child_env() -> dict[str, str]:
    """The environment of a parsing child: CHILD_ENV_KEYS as the caller has them, and a PYTHONPATH
    that finds the sluice package."""
    env = {key: os.environ[key] for key in CHILD_ENV_KEYS if key in os.environ}
    root = str(Path(__file__).resolve().parents[3])  # the folder that holds the sluice package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return env


class ExtractForkServer(forkserver.ForkServer):
    """The standard fork server, started with ``child_env()`` instead of the whole environment of
    the process that asks (``ensure_running`` as in CPython 3.11, launched through ``subprocess``,
    which takes an environment, instead of ``util.spawnv_passfds``, which does not)."""

    # The private state of CPython's ForkServer that this class drives, and below the private
    # helpers of multiprocessing it calls: typeshed declares none of them (hence the ignores). The
    # annotations only type what the base class makes.
    _lock: threading.Lock
    _forkserver_address: str | None
    _forkserver_alive_fd: int | None
    _forkserver_pid: int | None
    _preload_modules: list[str]

    def __init__(self) -> None:
        super().__init__()
        # kept, so that nothing but ensure_running reaps the server
        self._launched: subprocess.Popen[bytes] | None = None

    def ensure_running(self) -> None:
        with self._lock:
            resource_tracker.ensure_running()
            if self._forkserver_pid is not None:
                pid, _ = os.waitpid(self._forkserver_pid, os.WNOHANG)
                if not pid:
                    return  # still alive
                if self._forkserver_alive_fd is not None:  # set with the pid
                    os.close(self._forkserver_alive_fd)
                self._forkserver_address = self._forkserver_alive_fd = self._forkserver_pid = None
                if self._launched is not None:
                    self._launched.returncode = -1  # reaped above
            self._launch_server()

    def _launch_server(self) -> None:
        data = {}
        if self._preload_modules:
            prepared = spawn.get_preparation_data("ignore")
            data = {k: v for k, v in prepared.items() if k in ("main_path", "sys_path")}
        with socket.socket(socket.AF_UNIX) as listener:
            new_address = connection.arbitrary_address  # type: ignore[attr-defined]  # see above
            address = new_address("AF_UNIX")
            listener.bind(address)
            if not mp_util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()  # every client holds the write end
            try:
                cmd = (
                    "from multiprocessing.forkserver import main; "
                    f"main({listener.fileno()}, {alive_r}, {self._preload_modules!r}, **{data!r})"
                )
                exe = spawn.get_executable()
                flags = mp_util._args_from_interpreter_flags()  # type: ignore[attr-defined]  # see above
                self._launched = subprocess.Popen(
                    [exe, *flags, "-c", cmd],
                    pass_fds=(listener.fileno(), alive_r),
                    env=child_env(),
                    restore_signals=False,
                )
            except BaseException:
                os.close(alive_w)
                raise
            finally:
                os.close(alive_r)
            self._forkserver_address = address
            self._forkserver_alive_fd = alive_w
            self._forkserver_pid = self._launched.pid


SERVER = ExtractForkServer()


class ExtractPopen(popen_forkserver.Popen):
    """``popen_forkserver.Popen`` (CPython 3.11) whose child does not import the calling program's
    main script again (a worker's or the console's): its preparation data leaves it out."""

    def _launch(self, process_obj):
        prep_data = {
            k: v
            for k, v in spawn.get_preparation_data(process_obj._name).items()
            if not k.startswith("init_main")
        }
        buf = io.BytesIO()
        mp_context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            mp_context.set_spawning_popen(None)
        self.sentinel, w = SERVER.connect_to_new_process(self._fds)
        _parent_w = os.dup(w)
        self.finalizer = mp_util.Finalize(self, mp_util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class ExtractProcess(mp_context.ForkServerProcess):
    """An extraction child forked from a fork server that has the extraction module and PyMuPDF
    imported (started by the first parse in this process). It starts in milliseconds instead of
    an interpreter start and a PyMuPDF import (about 0.3 s of CPU: more than encoding a small
    document), and a child per document keeps what a child is for: limits, a kill on cancel or
    deadline, a crash that stays there."""

    # The private state of CPython's BaseProcess that ``start`` drives (typeshed does not declare
    # it): annotations only, the base class makes the attributes.
    _check_closed: Callable[[], None]
    _popen: popen_forkserver.Popen | None
    _parent_pid: int
    _sentinel: int
    _target: Any
    _args: Any
    _kwargs: Any

    @staticmethod
    def _Popen(process_obj):
        _preload()
        return ExtractPopen(process_obj)

    def start(self) -> None:
        """``BaseProcess.start`` without its refusal in a daemonic process: Huey's process workers
        are daemonic, and an extraction child cannot outlive them (it dies with the fork server,
        which ends when the worker does)."""
        self._check_closed()
        assert self._popen is None, "cannot start a process twice"
        assert self._parent_pid == os.getpid(), (
            "can only start a process object created by current process"
        )
        mp_process._cleanup()  # type: ignore[attr-defined]  # private, not in typeshed
        popen = self._popen = self._Popen(self)
        self._sentinel = popen.sentinel
        del self._target, self._args, self._kwargs
        mp_process._children.add(self)  # type: ignore[attr-defined]  # private, not in typeshed


_preload_lock = threading.Lock()
_preloaded = False


def _preload() -> None:
    global _preloaded
    with _preload_lock:
        if not _preloaded:
            SERVER.set_forkserver_preload(["sluice.pipeline.parsing.preload"])
            _preloaded = True
