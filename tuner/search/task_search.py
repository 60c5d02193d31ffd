"""Search for one task: sample MetaSchedule's design space, evolve with its mutators, and propose
batches of unmeasured candidates ranked by the cost model."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import Trace

from common.error_text import error_line
from costmodel import CandidateFeatures, CostModel, TopKWithExploration
from tuner.spaces import metaschedule as msc
from tuner.spaces.gpu_tiles import checking, gpu_limits
from tuner.spaces.register_tiles import RegisterFile, register_file

from .parallel import THREADS, parallel_map


@dataclass
class Candidate:
    key: str  # structural identity of the scheduled module
    schedule: Schedule
    parent: str | None = None  # the candidate this one was mutated from; None for a fresh sample
    transferred: bool = False  # replayed from another model's tuning (see ``TaskSearch.add_transferred``)

    @property
    def mod(self) -> tvm.IRModule:
        return self.schedule.mod

    @property
    def trace_json(self) -> str:
        return msc.trace_to_json(self.schedule)


@dataclass(frozen=True)
class SearchConfig:
    fresh_per_pick: int = 16  # fresh random samples scored per fresh candidate proposed
    population: int = 32  # evolved population: the best measured, then the best-rated fresh samples
    generations: int = 2
    elite_share: float = 0.5  # of the population seeded with the best measured candidates
    mutant_share: float = 0.5  # of a batch taken from evolved mutants; the rest are fresh samples
    max_share_per_parent: float = 0.25  # of a batch that may descend from one parent
    sample_attempts: int = 64  # tries per wanted sample (on GPUs most random samples fail verification)
    register_tile_share: float = 0.75  # of fresh CPU samples whose tiles are drawn to fill the registers


class TaskSearch:
    def __init__(
        self,
        mod: tvm.IRModule,
        target: tvm.target.Target,
        seed: int,
        cost_model: CostModel,
        features: CandidateFeatures,
        group: str,
        config: SearchConfig | None = None,
    ):
        self.mod = mod
        self.group = group
        self.cost_model = cost_model
        self.features = features
        self.policy = TopKWithExploration()  # picks the batch from the rated candidates
        self.config = config or SearchConfig()
        self.rng = np.random.default_rng(seed)
        self.context = msc.make_context(mod, target, seed, num_threads=THREADS)
        self.registers = register_file(target)  # None: every fresh sample as MetaSchedule draws it
        self.gpu = gpu_limits(target)  # a GPU's limits that fresh GPU tiles are drawn within (None: not a GPU)
        self.unsearchable: str | None = None  # why no design space could be made: the kernel keeps TVM's default
        try:
            self.spaces = msc.design_spaces(self.context)
        except Exception as err:  # noqa: BLE001 - a schedule rule's error (ScheduleError, TVMError) on one kernel
            self.spaces, self.unsearchable = [], f"its design space cannot be generated ({error_line(err)})"
        self.postprocs = msc.postprocessors(self.context)
        self.mutators, probs = msc.mutators(self.context)
        self.mutator_probs = np.asarray(probs) / sum(probs) if probs else np.zeros(0)
        self.seen: set[str] = set()  # proposed (measured, being measured, or dropped by the filter): never again
        self.elites: list[tuple[float, Candidate]] = []  # best measured first
        self.exhausted = not self.spaces
        self.draws = 0  # random samples drawn from the design space, for statistics
        self._features: dict[str, np.ndarray] = {}
        self._fresh: dict[str, Candidate] = {}  # sampled, scored, not yet picked: carried to the next batch
        self._seeds: list[Candidate] = []  # given from outside (transfer-tuning): proposed before anything else

    # -- what was measured ----------------------------------------------------------------------
    def observe(self, candidate: Candidate, latency: float | None) -> None:
        """Learn from a measured candidate (``latency`` None if it failed)."""
        self.seen.add(candidate.key)
        self.cost_model.add(self.group, self.feature_rows([candidate]), [latency])
        if latency is not None:
            self.elites.append((latency, candidate))
            self.elites.sort(key=lambda pair: pair[0])
            del self.elites[self.config.population :]

    def skip(self, candidate: Candidate) -> None:
        """Never propose ``candidate`` again: the filter predicted it poor and it was not measured."""
        self.seen.add(candidate.key)
        self._fresh.pop(candidate.key, None)

    def restore(self, measured: list[tuple[str, str, float | None]]) -> None:
        """Take in candidates (key, trace JSON, latency or None) measured by earlier runs of this work dir."""
        schedules = parallel_map(lambda item: _replayed_or_none(self.mod, item[1]), measured)
        kept = [
            (Candidate(key, sch), latency)
            for (key, _, latency), sch in zip(measured, schedules, strict=True)
            if sch is not None
        ]
        self.feature_rows([candidate for candidate, _ in kept])  # one batched extraction
        for candidate, latency in kept:
            self.observe(candidate, latency)

    # -- proposing -----------------------------------------------------------------------------
    def add_transferred(self, traces: Sequence[Trace], max_seeds: int, replay_seed: int, retile=None) -> list[int]:
        """Replay schedules tuned for other kernels (transfer-tuning) on this task's kernel, their
        tile sizes fitted by ``retile``, and queue up to ``max_seeds`` new ones to be proposed first;
        returns the indices of the traces queued."""
        queued = {c.key for c in self._seeds}
        used = []
        for index, trace in enumerate(traces):
            if len(used) >= max_seeds:
                break
            sch = msc.replay(self.mod, trace, replay_seed, self.postprocs, retile=retile)
            if sch is None:
                continue
            key = msc.structural_key(sch.mod)
            if key not in self.seen and key not in queued:
                self._seeds.append(Candidate(key, sch, transferred=True))
                queued.add(key)
                used.append(index)
        return used

    def add_seeds(self, schedules: Sequence[Schedule]) -> int:
        """Queue ready schedules of this kernel (its analytic one) to be proposed first, measured whatever
        the filter says; returns how many were new."""
        queued = {c.key for c in self._seeds}
        added = 0
        for sch in schedules:
            key = msc.structural_key(sch.mod)
            if key not in self.seen and key not in queued:
                self._seeds.append(Candidate(key, sch, transferred=True))
                queued.add(key)
                added += 1
        return added

    @property
    def seeds_waiting(self) -> bool:
        """Whether queued seeds (see ``add_transferred``) are still to be proposed."""
        return any(c.key not in self.seen for c in self._seeds)

    def propose(self, n: int) -> list[Candidate]:
        """Up to ``n`` of the queued seeds (see ``add_transferred``) while any wait, alone: the search
        starts from what they measure, in the next batch; then ``_search(n)``. What is proposed is seen
        at once: a batch still being measured when the next is proposed (``LoopConfig.pipeline``) is not
        proposed again."""
        waiting = [c for c in self._seeds if c.key not in self.seen]
        seeds, self._seeds = waiting[:n], waiting[n:]
        proposed = seeds or (self._search(n) if self.spaces else [])
        self.seen.update(c.key for c in proposed)
        return proposed

    def _search(self, n: int) -> list[Candidate]:
        """Up to ``n`` candidates never measured before; fewer if the space runs dry.

        Half are evolved (mutants of the best measured and best-rated candidates), half are the
        model's pick among many fresh random samples. Evolution refines what works; the fresh
        half finds new regions, and keeps a model that overrates some region (it happens, with
        little data) from filling whole batches with it.
        """
        if not self.cost_model.trained:
            return self._sample_new(n, set())
        n_mutants = int(round(n * self.config.mutant_share))
        fresh = self._refresh_pool(max(1, n - n_mutants) * self.config.fresh_per_pick)
        fresh_scores = self._scores(fresh)
        elites = [c for _, c in self.elites[: int(self.config.population * self.config.elite_share)]]
        best_fresh = [
            fresh[i] for i in np.argsort(-fresh_scores, kind="stable")[: self.config.population - len(elites)]
        ]
        population = elites + best_fresh
        scores = self._scores(population)
        mutants: dict[str, Candidate] = {}
        for _ in range(self.config.generations):
            children = [c for c in self._mutate(population, scores, len(population)) if c.key not in self.seen]
            for child in children:
                mutants.setdefault(child.key, child)
            merged = list({c.key: c for c in (*population, *children)}.values())
            merged_scores = self._scores(merged)
            keep = np.argsort(-merged_scores, kind="stable")[: len(population)]
            population, scores = [merged[i] for i in keep], merged_scores[keep]
        fresh_keys = {c.key for c in fresh}
        family_cap = max(1, int(n * self.config.max_share_per_parent))
        candidates = self._one_family_at_most([c for c in mutants.values() if c.key not in fresh_keys], family_cap)
        picked = self._pick(candidates, min(len(candidates), n_mutants))
        taken = {c.key for c in picked}
        picked += self._pick([c for c in fresh if c.key not in taken], n - len(picked))
        for candidate in picked:
            self._fresh.pop(candidate.key, None)
        return picked

    def _refresh_pool(self, size: int) -> list[Candidate]:
        """``size`` unmeasured random samples: at least half new, the rest the best-rated left over
        from this task's previous batch (their features are already known)."""
        kept = [c for c in self._fresh.values() if c.key not in self.seen]
        if kept:
            order = np.argsort(-self._scores(kept), kind="stable")
            kept = [kept[i] for i in order[: size // 2]]
        new = self._sample_new(size - len(kept), {c.key for c in kept})
        self._fresh = {c.key: c for c in (*kept, *new)}
        return list(self._fresh.values())

    def _pick(self, candidates: list[Candidate], k: int) -> list[Candidate]:
        if k <= 0 or not candidates:
            return []
        return [candidates[i] for i in self.policy.select(self._scores(candidates), k, self.rng)]

    def _one_family_at_most(self, candidates: list[Candidate], cap: int) -> list[Candidate]:
        """The candidates in score order, keeping at most ``cap`` children of any one parent."""
        order = np.argsort(-self._scores(candidates), kind="stable")
        per_parent: dict[str | None, int] = {}
        kept = []
        for i in order:
            parent = candidates[i].parent
            if per_parent.get(parent, 0) < cap:
                per_parent[parent] = per_parent.get(parent, 0) + 1
                kept.append(candidates[i])
        return kept

    def feature_rows(self, candidates: Iterable[Candidate]) -> np.ndarray:
        candidates = list(candidates)
        missing = [c for c in candidates if c.key not in self._features]
        if missing:
            rows = self.features.extract(self.context, [msc.measure_candidate(c.schedule) for c in missing])
            for candidate, row in zip(missing, rows, strict=True):
                self._features[candidate.key] = row
        return (
            np.stack([self._features[c.key] for c in candidates]) if candidates else np.zeros((0, self.features.width))
        )

    def _scores(self, candidates: list[Candidate]) -> np.ndarray:
        return self.cost_model.predict(self.feature_rows(candidates), self.rng)

    def _seed(self) -> int:
        return int(self.rng.integers(1, msc.MAX_SEED))

    def _sample_new(self, n: int, exclude: set[str]) -> list[Candidate]:
        found: dict[str, Candidate] = {}
        attempts = valid_so_far = 0
        while len(found) < n and attempts < n * self.config.sample_attempts:
            # Ask for a little more than is missing; where many samples are rejected (GPU verification
            # rejects most), ask for proportionally more. Repeats do not count against the rate: a small
            # space answers a larger round with more repeats, not with more new samples.
            rate = valid_so_far / attempts if attempts else 1.0
            wanted = max(4, int((n - len(found)) * 1.2 / max(rate, 0.05)))
            attempts += wanted
            self.draws += wanted
            draws = [self._draw() for _ in range(wanted)]
            valid = new = 0
            for sch in parallel_map(lambda d: msc.sample(self.mod, d[0], d[1], self.postprocs, d[2], self.gpu), draws):
                if sch is None or len(found) >= n:
                    continue
                valid += 1
                key = msc.structural_key(sch.mod)
                if key not in self.seen and key not in exclude and key not in found:
                    found[key] = Candidate(key, sch)
                    new += 1
            valid_so_far += valid
            if valid and new < 0.05 * valid and attempts >= n:
                break  # nearly every valid sample is one seen before: a small space, nearly all known
        if not found and n:
            self.exhausted = True
        return list(found.values())

    def _draw(self) -> tuple[Schedule, int, RegisterFile | None]:
        """A design space, a seed, and the registers its tiles are drawn to fill (None: MetaSchedule's draw)."""
        space = self.spaces[int(self.rng.integers(len(self.spaces)))]
        fitted = self.registers is not None and self.rng.random() < self.config.register_tile_share
        return space, self._seed(), self.registers if fitted else None

    def _mutate(self, parents: list[Candidate], scores: np.ndarray, count: int) -> list[Candidate]:
        """``count`` mutants of parents drawn in proportion to their predicted score."""
        if not parents or not self.mutators:
            return []
        weights = scores - scores.min() + 1e-3
        weights = weights / weights.sum()
        draws = [
            (
                parents[int(self.rng.choice(len(parents), p=weights))],
                self.mutators[int(self.rng.choice(len(self.mutators), p=self.mutator_probs))],
                self._seed(),
                self._seed(),
            )
            for _ in range(count)
        ]
        return [c for c in parallel_map(self._mutant, draws) if c is not None]

    def _mutant(self, draw: tuple) -> Candidate | None:
        parent, mutator, mutate_seed, replay_seed = draw
        trace = msc.mutate(mutator, parent.schedule.trace, mutate_seed)
        if trace is None:
            return None
        sch = msc.replay(self.mod, trace, replay_seed, self.postprocs, decide=checking(trace, self.gpu, replay_seed))
        return Candidate(msc.structural_key(sch.mod), sch, parent.parent or parent.key) if sch is not None else None


def _replayed_or_none(mod, trace_json: str):
    """A stored trace replayed on ``mod``; None where it no longer fits it (TVM's schedule
    primitives refuse it): such a record stays in the database but cannot seed the search."""
    try:
        return msc.schedule_from_json(mod, trace_json)
    except RuntimeError:  # tvm's ScheduleError and InternalError both are
        return None
