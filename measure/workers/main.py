"""Entry point of a worker process: ``python -m measure.workers.main REQUEST_FD REPLY_FD ROLE``.

Roles: ``build`` compiles candidates (full TVM), ``run`` loads and times built artifacts (the TVM
runtime is enough), ``cluster`` is the tuner's driver on a Ray cluster (``measure.cluster.driver``).
Imports happen once, before the worker reports ready.
"""

from __future__ import annotations

import faulthandler
import inspect
import os
import signal
import sys
import threading
import time
import traceback

from .env import CUDA_BUILD_ENV, RUN_DEVICE_ENV
from .error_report import describe_error
from .faults import FAULTS_ENV, inject, plan_from_env
from .worker import receive_message, send_message


def _load_handlers(role: str) -> dict:
    if role == "build":
        # Compiling needs no GPU, and on one each CUDA context costs ~0.5 GB of its memory (16 build
        # workers held 8 GB on an H100): hidden before anything can create one.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        if os.environ.get(CUDA_BUILD_ENV) == "1":
            _prepare_cuda_builds()
        from . import build_job

        build_job.warm_up()
        return build_job.HANDLERS
    if role == "run":
        from . import owner_job, run_job
        from .runtime_extras import load_runtime_extras

        missing = load_runtime_extras()  # the sort, top-k and random functions models call by name
        if missing:
            print(f"TVM's extern functions (sort, top-k) are not loaded: {missing}", flush=True)
        run_job.warm_up(os.environ.get(RUN_DEVICE_ENV, "cpu"))
        return run_job.HANDLERS | owner_job.HANDLERS
    if role == "cluster":
        from measure.cluster import driver as cluster_driver

        return cluster_driver.HANDLERS
    raise ValueError(f"unknown worker role {role!r}")


def _prepare_cuda_builds() -> None:
    """The compile path (before TVM is imported), then NVRTC's lean sources in front of TVM's callback."""
    from measure.cuda.compile_env import prepare_cuda_build_env

    mode = prepare_cuda_build_env()
    print(f"CUDA compile mode: {mode.describe()}", flush=True)
    from measure.cuda.nvrtc_source import LEAN_SOURCES, use_lean_nvrtc_sources

    if use_lean_nvrtc_sources() and mode.mode == "nvrtc":
        print(f"NVRTC sources: {LEAN_SOURCES}", flush=True)


def _die_with_parent(poll_seconds: float = 0.5) -> None:
    """Workers run in a session of their own (a timeout kills a worker's whole process group), so
    nothing kills them with a tuner that was SIGKILLed, and a busy one (a hanging candidate) never
    reads the closed pipe: a thread watches for the parent to go and takes the group down then.
    (Not PR_SET_PDEATHSIG: it fires when the spawning *thread* ends, and workers are restarted from
    short-lived pool threads.)"""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _with_injected_faults(role: str, handlers: dict) -> dict:
    plan = plan_from_env()
    if plan is None:
        return handlers
    print(f"{FAULTS_ENV}: injecting {', '.join(plan.kinds)} into {plan.rate:.0%} of candidates", flush=True)
    return inject(role, handlers, plan)


def main(argv: list[str]) -> int:
    request_fd, reply_fd, role = int(argv[1]), int(argv[2]), argv[3]
    _die_with_parent()
    faulthandler.enable()
    # tvm_ffi imports torch whenever it is installed (seconds); workers never need it.
    sys.modules.setdefault("torch", None)
    started = time.monotonic()
    try:
        handlers = _load_handlers(role)
        handlers = _with_injected_faults(role, handlers)
    except Exception as err:  # report any start-up failure to the parent rather than dying silently
        traceback.print_exc()
        send_message(reply_fd, ("failed", describe_error(err)))
        return 1
    send_message(reply_fd, ("ready", {"pid": os.getpid(), "seconds": time.monotonic() - started}))
    while True:
        try:
            op, kwargs = receive_message(request_fd)
        except EOFError:  # the tuner went away
            return 0
        if op == "exit":
            return 0
        try:
            result = handlers[op](**kwargs)
            if inspect.isgenerator(result):  # a stream (WorkerProcess.stream): each item as it comes
                for item in result:
                    _reply(reply_fd, ("item", item))
                result = None
        except Exception as err:  # a failing candidate is a result, not a reason to stop serving
            traceback.print_exc()
            # Answer while the failed request's objects are still alive: after a CUDA fault, freeing
            # their GPU memory may abort this process (the tuner then replaces it).
            _reply(reply_fd, ("error", describe_error(err)))
            continue
        _reply(reply_fd, ("ok", result))


def _reply(reply_fd: int, reply: tuple) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    send_message(reply_fd, reply)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
