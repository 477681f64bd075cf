"""The extraction children's process class (``sluice.pipeline.parsing.parse`` starts one per document).

Kept apart and light (only the standard library): a child unpickles its Process object, which
imports this module, and the fork server has it imported already (``extract_preload``).
"""

from __future__ import annotations

import io
import os
import threading
from multiprocessing import context as mp_context
from multiprocessing import forkserver, popen_forkserver, reduction, spawn
from multiprocessing import process as mp_process
from multiprocessing import util as mp_util


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
        self.sentinel, w = forkserver.connect_to_new_process(self._fds)
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

    @staticmethod
    def _Popen(process_obj):
        _preload()
        return ExtractPopen(process_obj)

    def start(self) -> None:
        """``BaseProcess.start`` without its refusal in a daemonic process: Huey's process workers are
        daemonic, and an extraction child cannot outlive them (it dies with the fork server, which
        ends when the worker does)."""
        self._check_closed()
        assert self._popen is None, "cannot start a process twice"
        assert self._parent_pid == os.getpid(), (
            "can only start a process object created by current process"
        )
        mp_process._cleanup()
        self._popen = self._Popen(self)
        self._sentinel = self._popen.sentinel
        del self._target, self._args, self._kwargs
        mp_process._children.add(self)


_preload_lock = threading.Lock()
_preloaded = False


def _preload() -> None:
    global _preloaded
    with _preload_lock:
        if not _preloaded:
            forkserver.set_forkserver_preload(["sluice.pipeline.parsing.preload"])
            _preloaded = True
