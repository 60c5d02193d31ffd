"""Measurements timed in the order they were asked for. Each call to the engine's ``measure`` takes a turn
as it is made; its windows are timed only once every earlier turn has ended, so a second batch whose
builds finish first waits for the batch submitted before it, and no two batches' windows interleave."""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterator


class TurnOrder:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._numbers = itertools.count()
        self._open: set[int] = set()

    def take(self) -> int:
        with self._changed:
            turn = next(self._numbers)
            self._open.add(turn)
            return turn

    def end_with(self, results: Iterator, turn: int) -> None:
        """End ``turn`` when the generator ``results`` is collected, should it be dropped unstarted
        (an unstarted generator's ``finally`` never runs)."""
        weakref.finalize(results, self.end, turn)

    def wait(self, turn: int) -> None:
        """Return once no turn taken before ``turn`` is open (its own windows follow one another)."""
        with self._changed:
            self._changed.wait_for(lambda: min(self._open) == turn)

    def end(self, turn: int) -> None:
        with self._changed:
            self._open.discard(turn)
            self._changed.notify_all()
