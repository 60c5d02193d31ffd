"""Where CPU kernels are timed: how many can run at once and which cores each measuring process gets.

A CPU kernel compiled for ``num-cores`` threads needs that many cores to itself. Two measuring
processes sharing cores distort each other even when only one is timing (a second, idle runner
process on the same cores slowed many timings of a matmul using all of them), so the default
is one runner per ``num-cores`` physical cores, and where there are several, each is pinned to its
own cores.
"""

from __future__ import annotations

import os

from common.host import physical_cores

CPUS_ENV = "TENSOR_TUNER_CPUS"  # comma-separated CPU ids a measuring process pins itself to


def default_cpu_dop(kernel_threads: int) -> int:
    """How many ``kernel_threads``-thread kernels fit side by side on this host's physical cores."""
    return max(1, physical_cores() // max(1, kernel_threads))


def runner_cpu_sets(runners: int, kernel_threads: int) -> list[list[int] | None]:
    """The CPUs each of ``runners`` measuring processes should be pinned to: disjoint sets of
    ``kernel_threads`` CPUs where this process's CPUs hold that many, else None (not pinned).
    One runner is never pinned: it has the host to itself."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if runners < 2 or runners * kernel_threads > len(allowed):
        return [None] * runners
    return [allowed[i * kernel_threads : (i + 1) * kernel_threads] for i in range(runners)]


def pinned_env(cpus: list[int] | None) -> dict[str, str]:
    """A measuring worker's environment for running on ``cpus`` alone (None: not pinned); TVM must
    then leave its threads where the process is rather than binding them to cores of its own choosing."""
    if cpus is None:
        return {}
    return {CPUS_ENV: ",".join(map(str, cpus)), "TVM_BIND_THREADS": "0"}


def pin_from_env() -> None:
    """Pin this process to the CPUs in ``$TENSOR_TUNER_CPUS``, if set (called by measuring workers)."""
    cpus = os.environ.get(CPUS_ENV)
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(cpu) for cpu in cpus.split(",")})
