"""Running a backend in worker processes, so that a case that crashes or hangs costs only that case.

A :class:`Worker` is one ``python -P -m xconv_conformance.worker`` process serving one backend in
one role: "judge" (run and judge a case: an :class:`~.runner.Outcome`) or "digest" (the result
digests of a deterministic case: the fresh-process half of the determinism check). Cases travel
one at a time over a dedicated pipe pair (:mod:`.channel`); the worker lives across cases, so its
start-up (imports, plugin loading) is paid once. The worker's stdout and stderr go to a log file:
nothing a backend prints can corrupt a reply, and what it wrote while a case ran is kept.

- A case that kills its worker (a signal, or an exit) is "crashed", with the signal's name and
  the tail of the stderr the case wrote (the worker enables :mod:`faulthandler`, so a segfault
  leaves the Python stack of the crash there).
- A case still running after ``case_timeout`` seconds is "timed_out": the worker is sent SIGABRT
  (faulthandler prints where it hung), then killed; the stderr tail is kept likewise.

In both cases the next case starts a fresh worker. A worker that cannot start (its plugin
crashes or hangs on import) fails every case it was asked for with that reason, once.

:class:`CaseRunner` and :class:`FreshDigests` are what the command line and the pytest plugin use.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from .channel import Channel, ChannelClosed, ChannelTimeout
from .runner import Outcome, Watch, availability, run_case

DEFAULT_CASE_TIMEOUT = 300.0
START_TIMEOUT = 120.0          # seconds a worker may take to import xconv and the plugins
STDERR_TAIL = 4000             # characters of a crashed case's stderr kept in its record
_ABORT_GRACE = 2.0             # seconds between SIGABRT (faulthandler's traceback) and SIGKILL


class Died(Exception):
    """The worker died or hung on a case: ``status`` "crashed" or "timed_out", ``signal``, ``stderr``."""

    def __init__(self, status: str, signal_name: str | None, stderr: str, detail: str):
        super().__init__(detail)
        self.status, self.signal, self.stderr, self.detail = status, signal_name, stderr, detail


class Unregistered(Exception):
    """The backend is not registered in a fresh process (it was registered at run time in this one)."""


class StartFailed(Exception):
    """The worker could not start (it crashed, hung or failed before serving a case)."""


def signal_name(returncode: int | None) -> str | None:
    """"SIGSEGV" for a process killed by signal 11 (returncode -11), None for a normal exit."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _kit_path() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


#: Started without the current directory on sys.path (``python -m`` would put it first, so an
#: ``xconv_conformance/`` folder or a ``numpy.py`` where the user runs the kit would be imported):
#: ``-P`` on Python 3.11+, else a bootstrap that drops sys.path[0] ("" under -c) before importing anything.
_BOOT = ("import sys; del sys.path[0]; import runpy; "
         "runpy.run_module('xconv_conformance.worker', run_name='__main__', alter_sys=True)")


def worker_command(*args: str) -> list[str]:
    """The command line of a worker process (isolated from the current directory, see :data:`_BOOT`)."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", "xconv_conformance.worker", *args]
    return [sys.executable, "-c", _BOOT, *args]


def worker_pythonpath(environ) -> str:
    """``$PYTHONPATH`` for a worker: the kit first, then the caller's entries made absolute. Empty entries
    (often left by ``PYTHONPATH=$PYTHONPATH:...`` with the variable unset) would mean the current
    directory: they are dropped; a relative entry names a folder on purpose: it is kept, absolute."""
    entries = [os.path.abspath(p) for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([_kit_path()] + entries)


class Worker:
    """One worker process for ``backend`` in ``role``; started on first use, restarted after a crash."""

    def __init__(self, backend: str, role: str, imports=(), case_timeout: float = DEFAULT_CASE_TIMEOUT,
                 start_timeout: float = START_TIMEOUT):
        self.backend, self.role, self.imports = backend, role, list(imports)
        self.case_timeout, self.start_timeout = float(case_timeout), float(start_timeout)
        self.proc = self.channel = self.log = None
        self.broken: str | None = None        # why no worker can start; set once
        self.unregistered = False
        self.ready = False
        self.starts = 0

    # -- life cycle

    def spawn(self) -> None:
        """Start the process and send it its orders without waiting for it to be ready (so that its
        imports overlap with other work); :meth:`call` waits."""
        if self.broken is not None or (self.proc is not None and self.proc.poll() is None):
            return
        self.close()
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        self.log = tempfile.TemporaryFile(prefix="xconv-worker-")
        env = dict(os.environ, XCONV_CONFORMANCE_ROLE=self.role)
        env["PYTHONPATH"] = worker_pythonpath(env)
        try:
            self.proc = subprocess.Popen(
                worker_command(str(req_r), str(res_w)),
                stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, pass_fds=(req_r, res_w), env=env,
                start_new_session=True)
        finally:
            os.close(req_r)
            os.close(res_w)
        self.channel = Channel(res_r, req_w)
        self.starts += 1
        self.ready = False
        try:
            self.channel.send({"backend": self.backend, "role": self.role, "imports": self.imports})
        except ChannelClosed:
            pass                      # it died at once: _await_ready says how

    def _await_ready(self) -> None:
        try:
            reply = self.channel.recv(time.monotonic() + self.start_timeout)
        except (ChannelClosed, ChannelTimeout) as exc:
            hung = isinstance(exc, ChannelTimeout)
            self._stop(abort=hung)
            why = f"no answer within {self.start_timeout:g} s" if hung else self._exit_text()
            self.broken = f"the worker process could not start ({why}): {self._tail(0)}"
            raise StartFailed(self.broken) from None
        if reply[0] == "unregistered":
            self.close()
            self.broken, self.unregistered = reply[1], True
            raise Unregistered(reply[1])
        if reply[0] != "ready":
            self.close()
            self.broken = f"the worker process failed to start: {reply[1]}"
            raise StartFailed(self.broken)
        self.ready = True

    def _exit_text(self) -> str:
        rc = self.proc.returncode if self.proc is not None else None
        sig = signal_name(rc)
        return f"killed by {sig}" if sig else f"exited with status {rc}"

    def _tail(self, start: int) -> str:
        if self.log is None:
            return ""
        self.log.flush()
        self.log.seek(start)
        text = self.log.read().decode("utf-8", "replace")
        return text if len(text) <= STDERR_TAIL else "..." + text[-STDERR_TAIL:]

    def _stop(self, abort: bool = False) -> None:
        """End the process: SIGABRT first when ``abort`` (a traceback of where it hangs), then SIGKILL."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            if abort:
                try:
                    proc.send_signal(signal.SIGABRT)
                    proc.wait(_ABORT_GRACE)
                except (subprocess.TimeoutExpired, OSError):
                    pass
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    proc.kill()
            proc.wait()
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def close(self) -> None:
        """Ask the worker to exit, then make sure it has; the log is discarded."""
        if self.proc is not None and self.proc.poll() is None and self.channel is not None:
            try:
                self.channel.send(("exit",))
                self.proc.wait(5)
            except (ChannelClosed, subprocess.TimeoutExpired):
                pass
        self._stop()
        self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None

    # -- serving a case

    def call(self, case, **options):
        """The worker's result for ``case``; raises Died, StartFailed or Unregistered."""
        if self.broken is not None:
            raise Unregistered(self.broken) if self.unregistered else StartFailed(self.broken)
        if self.proc is None or (self.ready and self.proc.poll() is not None):
            self.spawn()
        if not self.ready:
            self._await_ready()
        self.log.flush()
        start = os.fstat(self.log.fileno()).st_size
        try:
            self.channel.send(("case", case, options))
            reply = self.channel.recv(time.monotonic() + self.case_timeout)
        except ChannelTimeout:
            self._stop(abort=True)
            stderr = self._tail(start)
            self.close()
            raise Died("timed_out", None, stderr, f"timed out: still running after {self.case_timeout:g} s "
                                                  "(the worker was aborted and replaced)") from None
        except ChannelClosed:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self._stop()
            sig, what = signal_name(self.proc.returncode), self._exit_text()
            stderr = self._tail(start)
            self.close()
            raise Died("crashed", sig, stderr,
                       f"crashed: {sig or what} (the worker process died on this case and was replaced)") from None
        except Exception as exc:  # noqa: BLE001 - a reply that cannot be read: this worker is not to be trusted
            self.close()
            raise RuntimeError(f"its reply could not be read ({type(exc).__name__}: {exc})") from None
        if reply[0] == "error":
            raise RuntimeError(reply[1])
        return reply[1]


def stderr_excerpt(stderr: str, limit: int = 12) -> list[str]:
    """The telling lines of a crashed case's stderr: the last lines it wrote before faulthandler's
    report, the report's first line and the innermost frames (the module list is left out)."""
    lines = [line for line in stderr.rstrip().splitlines() if not line.startswith("Extension modules:")]
    fatal = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), None)
    if fatal is None:
        return lines[-limit:]
    return lines[max(0, fatal - 3):fatal + 1] + [line for line in lines[fatal + 1:] if line.strip()][:limit - 4]


def _hint(stderr: str) -> str:
    lines = stderr_excerpt(stderr)
    frames = [line.strip() for line in lines if line.strip().startswith("File ")]
    said = [line for line in lines if line.strip() and not line.startswith(("Fatal Python error", "Current thread",
                                                                            "Thread 0x", "  File "))]
    parts = ([said[-1][:200]] if said else []) + [line for line in lines if line.startswith("Fatal Python error")][:1]
    parts += [f"at {frames[0][:200]}"] if frames else []
    return f"; stderr: {' | '.join(parts)}" if parts else ""


def _died_outcome(case, backend: str, exc: Died) -> Outcome:
    return Outcome(case.id, backend, exc.status, exc.detail + _hint(exc.stderr), signal=exc.signal,
                   stderr=exc.stderr)


class CaseRunner:
    """Runs and judges the cases of one backend, in a worker process (``isolate``) or in this one.

    ``note`` says why a run asked to isolate runs in-process after all (a backend registered at
    run time by :func:`xconv.register_backend` exists only in this process).
    """

    def __init__(self, backend: str, *, isolate: bool = True, case_timeout: float = DEFAULT_CASE_TIMEOUT,
                 imports=(), keep_outputs: bool = False, spawn: bool = True):
        self.backend, self.keep_outputs = backend, keep_outputs
        self.worker = Worker(backend, "judge", imports, case_timeout) if isolate else None
        if self.worker is not None and spawn:
            self.worker.spawn()
        self.watch = Watch()
        self.note = ""
        self.unavailable: str | None = None     # the reason, when the backend cannot run here

    def run(self, case) -> Outcome:
        if self.unavailable is None:
            ok, reason = availability(self.backend)     # asked here: no worker for a backend that cannot run
            self.unavailable = "" if ok else reason
        if self.unavailable:
            self.close()
            return Outcome(case.id, self.backend, "unavailable", self.unavailable)
        if self.worker is not None:
            start = time.perf_counter()
            try:
                out = self.worker.call(case, keep_outputs=self.keep_outputs)
            except Died as exc:
                out = _died_outcome(case, self.backend, exc)
            except StartFailed as exc:
                out = Outcome(case.id, self.backend, "failed", str(exc))
            except Unregistered as exc:
                self.worker.close()
                self.worker = None
                self.note = (f"backend {self.backend!r} is not registered in a fresh process ({exc}): "
                             "its cases run in this process, not isolated")
                return self.run(case)
            except RuntimeError as exc:
                out = Outcome(case.id, self.backend, "failed", f"the worker failed: {exc}")
            out.seconds = time.perf_counter() - start
            return out
        return self.watch.after(run_case(case, self.backend, keep_outputs=self.keep_outputs))

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FreshDigests:
    """The result digests of deterministic cases computed in another process (a "digest" worker).

    :meth:`digest` returns a list (one SHA-256 or None per output), or a string saying why not:
    "refused: …", "error: …", "unregistered: …", or a :class:`Died` for a crash or a hang.
    """

    def __init__(self, backend: str, imports=(), case_timeout: float = DEFAULT_CASE_TIMEOUT, spawn: bool = False):
        self.worker = Worker(backend, "digest", imports, case_timeout)
        if spawn:
            self.worker.spawn()

    def digest(self, case):
        try:
            return self.worker.call(case)
        except Died as exc:
            return exc
        except Unregistered as exc:
            return f"unregistered: {exc}"
        except StartFailed as exc:
            return f"error: {exc}"
        except RuntimeError as exc:
            return f"error: the worker failed: {exc}"

    def close(self) -> None:
        self.worker.close()

