"""Ray's own log lines on the terminal of a memlib command: hidden unless asked for.

A build printed, besides its own lines, Ray's "Started a local Ray instance", Ray Data's INFO
blocks (its plan, then a progress dump every few seconds when stdout is not a terminal) and one
``core_worker.cc`` error line per actor pool: "Actor ... has constructor arguments in the object
store and max_restarts > 0 ... the actor restart will fail". That line is Ray Data's, not a fault
of memlib's: every ``ActorPoolMapOperator`` passes its transformer to its actors as an object
reference and asks for unlimited restarts by default, and the reference lives as long as the
operator, so a restart finds it. memlib keeps the restarts (a worker the memory monitor kills is
started again and its block retried) and hides the line.

``memlib … --verbose``, or any of :data:`RAY_LOG_VARS` in the environment, leaves all of Ray's
output as Ray prints it. The lines hidden stay in Ray's session logs
(``/tmp/ray/session_latest/logs``: python-core-driver-*.log, ray-data/).
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import threading

# asking Ray for its logs in the environment is asking to see them
RAY_LOG_VARS = ("RAY_LOGGING_LEVEL", "RAY_BACKEND_LOG_LEVEL", "RAY_DATA_LOGGING_CONFIG", "RAY_LOGGING_CONFIG_ENCODING")
RAY_LOGGERS = ("ray", "ray.data", "ray.serve", "ray.train", "ray.tune")

# a line of Ray's C++ logging: "[2026-11-28 00:19:21,551 E 10562 10562] core_worker.cc:2465: ..."
NATIVE_LINE = re.compile(rb"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [DIWEF] \d+ \d+\] ")


def ray_logs_wanted(verbose: bool) -> bool:
    """Whether Ray's own lines are shown: ``--verbose``, or Ray's logging set in the environment."""
    return verbose or any(os.environ.get(k) for k in RAY_LOG_VARS)


def quiet_python_loggers() -> None:
    """Ray's Python loggers at WARNING on the console (Ray Data's INFO plan and progress dumps,
    Serve's start lines; Ray Data's log file keeps everything), and Ray Data's one warning that
    its progress bars are off (memlib draws its own) consumed."""
    import ray.data  # first: its import configures its logger (DEBUG, a file and a console handler)
    from ray.util.debug import log_once

    for name in RAY_LOGGERS:
        logger = logging.getLogger(name)
        consoles = [h for h in logger.handlers if isinstance(h, logging.StreamHandler)
                    and not isinstance(h, logging.FileHandler)]
        if name == "ray.data" and consoles:
            for handler in consoles:
                handler.setLevel(logging.WARNING)
        else:
            logger.setLevel(logging.WARNING)
    ray.data.DataContext.get_current().enable_progress_bars = False
    log_once("ray_data_progress_manager_disabled")  # consumed here: Ray Data then never logs it


class NativeLineFilter:
    """This process's stderr without Ray's C++ log lines: file descriptor 2 becomes a pipe whose
    reader thread forwards every other line to the real stderr. Installed after ``ray.init`` so
    the processes it starts keep the real stderr; :meth:`close` (also at exit) puts it back."""

    def __init__(self, fd: int = 2):
        self.fd = fd
        self.hidden = 0
        self._real = os.dup(fd)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        self._read_end = read_end
        self._thread = threading.Thread(target=self._pump, name="memlib-ray-stderr", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def _forward(self, data: bytes) -> None:
        if NATIVE_LINE.match(data):
            self.hidden += 1
            return
        view = memoryview(data)
        while view:
            view = view[os.write(self._real if self._real >= 0 else self.fd, view):]

    def _pump(self) -> None:
        pending = b""
        while chunk := os.read(self._read_end, 65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._forward(line + b"\n")
            if pending and not pending.startswith(b"["):  # a prompt or a partial write: not Ray's
                self._forward(pending)
                pending = b""
        if pending:
            self._forward(pending)
        os.close(self._read_end)

    def close(self) -> None:
        """Give the process its stderr back, once every line written so far is forwarded."""
        if self._real < 0:
            return
        import sys

        sys.stderr.flush()
        os.dup2(self._real, self.fd)  # the pipe's last write end closes: the reader sees its end
        self._thread.join(timeout=2)
        os.close(self._real)
        self._real = -1


_FILTER: list[NativeLineFilter] = []


def hide_native_lines() -> None:
    """Install the :class:`NativeLineFilter` once per process (after ``ray.init``)."""
    if not _FILTER:
        _FILTER.append(NativeLineFilter())


def restore_stderr() -> None:
    """Remove the filter, if installed (when this process's Ray stops)."""
    while _FILTER:
        _FILTER.pop().close()
