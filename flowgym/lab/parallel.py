"""One map for every grid: cells of work run on a backend, results aggregated in the driver.

:func:`flowgym.lab.evaluation.evaluate` and :func:`~flowgym.lab.evaluation.tune` list their
cells (an agent spec or agent, the environment arguments, a seed, the horizons) and hand
them to a backend's :meth:`Backend.map`, which returns one result per cell **in the cells'
order**, whatever order they finished in. The aggregation (means, confidence intervals,
tie-breaking, non-finite handling) stays in the driver, so every backend gives the same
numbers as the serial loop, bit for bit. Workers return metrics (and the KV-usage series
of the first seed, for plots), never whole episodes; agent specs travel, and are built in
the worker.

Backends:

* ``serial`` (default): this process, one cell after the other.
* ``process``: a pool of ``workers`` local processes (the standard library's
  ``concurrent.futures`` with the ``spawn`` start method; each worker imports flowgym, so
  ``gym.make("FlowControl-v0")`` works there).
* ``ray``: Ray tasks (``pip install -e '.[ray]' in the flowgym checkout``), on a local Ray cluster started for
  the run, or on an existing one at ``address`` (``"auto"``, ``"ray://host:10001"``, ...).

A cell that raises in a worker surfaces as :class:`CellError` naming the cell; nothing is
silently dropped.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Backend", "CellError", "make_backend", "using", "BACKENDS"]

BACKENDS = ("serial", "process", "ray")


class CellError(RuntimeError):
    """A cell of a grid failed; the message names the cell and the worker's error."""


def _describe(cell: Any) -> str:
    d = getattr(cell, "describe", None)
    return d() if callable(d) else repr(cell)


def _worker_init() -> None:
    import flowgym  # noqa: F401  (registers FlowControl-v0 in the worker)


def _call(fn: Callable[[Any], Any], cell: Any) -> Any:
    try:
        return fn(cell)
    except Exception as e:  # name the cell; keep the worker's traceback as text
        raise CellError(f"cell {_describe(cell)} failed: {type(e).__name__}: {e}\n"
                        f"--- worker traceback ---\n{traceback.format_exc()}") from None


class Backend:
    """Runs ``fn`` on every cell; ``done(cell)`` is called in the driver as each finishes."""

    name = "serial"

    def map(self, fn: Callable[[Any], Any], cells: Sequence[Any],
            done: Callable[[Any], None] | None = None) -> list[Any]:
        out = []
        for c in cells:
            out.append(_call(fn, c))
            if done is not None:
                done(c)
        return out

    def close(self) -> None:
        """Release workers (a no-op for ``serial``)."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _died(err: BaseException, left: Sequence[str]) -> str:
    """The message of a dead worker process: a pool cannot tell which of the cells ``left`` (unfinished) was in it,
    so it names them all, the first five in full."""
    more = f" and {len(left) - 5} more" if len(left) > 5 else ""
    return (f"a worker process died ({err}); one of the {len(left)} cells not finished was running in it: "
            f"{'; '.join(left[:5])}{more}")


class ProcessBackend(Backend):
    """A pool of local worker processes (``spawn``), created at the first map and kept until :meth:`close`."""

    name = "process"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        self._pool: Any = None

    def _get(self) -> Any:
        if self._pool is None:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"),
                                             initializer=_worker_init)
        return self._pool

    def map(self, fn: Callable[[Any], Any], cells: Sequence[Any],
            done: Callable[[Any], None] | None = None) -> list[Any]:
        from concurrent.futures import FIRST_EXCEPTION, wait

        from concurrent.futures.process import BrokenProcessPool

        pool = self._get()
        futures = {pool.submit(_call, fn, c): i for i, c in enumerate(cells)}
        out: list[Any] = [None] * len(cells)
        done_ok: set[int] = set()
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for f in sorted(finished, key=futures.__getitem__):
                i = futures[f]
                err = f.exception()
                if err is not None:
                    # stop at once: the cells still running would hold the error back until they end
                    self._abandon()
                    if isinstance(err, CellError):
                        raise err
                    if isinstance(err, BrokenProcessPool):  # every cell not done fails with it: no culprit known
                        left = [j for j in range(len(cells)) if j not in done_ok]
                        raise CellError(_died(err, [_describe(cells[j]) for j in left])) from None
                    raise CellError(f"cell {_describe(cells[i])} failed in a worker process: "
                                    f"{type(err).__name__}: {err}") from None
                out[i] = f.result()
                done_ok.add(i)
                if done is not None:
                    done(cells[i])
        return out

    def _abandon(self) -> None:
        """Drop the pool without waiting for the cells it runs: its workers are ended (a later map starts a new
        pool)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        procs = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(timeout=5)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


class RayBackend(Backend):
    """Ray tasks, one per cell, on a local cluster or an existing one at ``address``.

    In a process already connected to Ray the running session is used: ``workers`` then bounds the cells in
    flight, and ``address`` is refused (it could not be applied)."""

    name = "ray"

    def __init__(self, workers: int | None = None, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ImportError("the ray backend needs Ray: pip install -e '.[ray]' in the flowgym checkout") from None
        self._ray = ray
        self.address = address
        self.workers = workers
        self._started = False
        if ray.is_initialized() and address is not None:  # this process is already connected: it would stay so
            raise ValueError(f"Ray is already running in this process, so address={address!r} cannot be applied: "
                             "leave address out to use the running session, or call ray.shutdown() first")
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "configure_logging": False}
            if address:
                _reachable(address)
                kwargs["address"] = address
            elif workers:
                kwargs["num_cpus"] = int(workers)
            try:
                ray.init(**kwargs)
            except Exception as e:  # a bad address, an unreachable cluster
                where = f"at {address!r}" if address else "(a local cluster)"
                raise ConnectionError(f"cannot start or reach a Ray cluster {where}: {type(e).__name__}: {e}") \
                    from None
            self._started = True
        self._remote: dict[Any, Any] = {}

    def map(self, fn: Callable[[Any], Any], cells: Sequence[Any],
            done: Callable[[Any], None] | None = None) -> list[Any]:
        ray = self._ray
        remote = self._remote.get(fn)
        if remote is None:
            # _call lives in this module: a worker that unpickles it imports flowgym (FlowControl-v0 registered)
            remote = self._remote[fn] = ray.remote(num_cpus=1, max_retries=0)(_call)
        # at most `workers` cells in flight: a session started elsewhere has its own size, which the
        # option asked for would otherwise not bound
        limit = len(cells) if not self.workers or self._started else int(self.workers)
        queue = iter(enumerate(cells))
        index: dict[Any, int] = {}
        pending: list[Any] = []

        def submit() -> None:
            for i, c in queue:
                r = remote.remote(fn, c)
                index[r] = i
                pending.append(r)
                if len(pending) >= limit:
                    return

        out: list[Any] = [None] * len(cells)
        submit()
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for r in ready:
                i = index[r]
                try:
                    out[i] = ray.get(r)
                except ray.exceptions.RayError as e:  # a task's error, or its worker died (crash, memory)
                    for p in pending:
                        ray.cancel(p, force=True)
                    cause = e.cause if isinstance(getattr(e, "cause", None), Exception) else e
                    if isinstance(cause, CellError):
                        raise CellError(str(cause)) from None
                    what = "" if isinstance(e, ray.exceptions.RayTaskError) else f"{type(e).__name__}: "
                    raise CellError(f"cell {_describe(cells[i])} failed in a Ray task: {what}{cause}") from None
                if done is not None:
                    done(cells[i])
            submit()
        return out

    def close(self) -> None:
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
            self._started = False


def _reachable(address: str, timeout: float = 3.0) -> None:
    """Fail fast, naming the address, when nothing listens at a ``host:port`` / ``ray://host:port``
    address (Ray's own client retries for about a minute before it says so). ``auto`` is Ray's."""
    import socket

    if address == "auto":
        return
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConnectionError(f"Ray address {address!r} is not host:port, ray://host:port or auto")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConnectionError(f"cannot reach a Ray cluster at {address!r}: {e.strerror or e} "
                              "(start one with 'ray start --head', see docs/scaling.md)") from None


def make_backend(name: str | Backend | None = "serial", *, workers: int | None = None,
                 address: str | None = None) -> Backend:
    """A backend by name: ``serial``, ``process`` (``workers`` processes, default: the cores)
    or ``ray`` (a local cluster of ``workers`` CPUs, or the cluster at ``address``)."""
    if isinstance(name, Backend):
        return name
    check_backend(name, workers=workers, address=address)
    if name in (None, "serial"):
        return Backend()
    if name == "process":
        return ProcessBackend(workers)
    return RayBackend(workers, address)


def check_backend(name: str | None, *, workers: int | None = None, address: str | None = None) -> None:
    """``ValueError`` unless :func:`make_backend` takes these arguments (checked without starting anything, so a
    command can refuse them before it writes)."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    if name in (None, "serial"):
        if workers is not None or address is not None:  # asked for, and it would not apply: say so
            raise ValueError(f"{'workers' if workers is not None else 'address'} configures the process or ray "
                             "backend; the serial backend runs in this process (give backend='process' or 'ray')")
    elif name == "process":
        if address is not None:
            raise ValueError("address names a Ray cluster; the process backend runs local processes (give "
                             "backend='ray')")
    elif name != "ray":
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    elif workers is not None and address is not None:  # the cluster's size decides: workers would be ignored
        raise ValueError("workers sizes the local Ray cluster a run starts; with address (an existing cluster) "
                         "its own CPUs decide: give one of the two")


def using(backend: str | Backend | None) -> Any:
    """A context giving the backend: one made from a name is closed at the end; one passed in is
    left open (a caller that runs several grids on one pool keeps it)."""
    import contextlib

    if isinstance(backend, Backend):
        return contextlib.nullcontext(backend)
    return make_backend(backend)
