"""The search proposes distinct, never-measured schedules, and knows when a space runs dry."""

import faulty

from costmodel import CandidateFeatures, CostModel
from tuner.search.task_search import TaskSearch


def test_a_small_space_is_sampled_without_spinning(llvm_target):
    search = TaskSearch(
        faulty.copy(64), llvm_target, seed=0, cost_model=CostModel(), features=CandidateFeatures(), group="copy"
    )
    first = search.propose(200)
    assert 0 < len(first) < 200 and len({c.key for c in first}) == len(first)
    assert search.draws < 200 * 4  # gives up once samples repeat, not after 64 tries per missing one
    for candidate in first:
        search.observe(candidate, 1e-6)
    again = search.propose(200)
    assert not ({c.key for c in again} & {c.key for c in first})


def test_a_space_a_little_smaller_than_a_batch_is_not_drawn_in_ever_larger_rounds(llvm_target):
    from tuner.spaces import metaschedule as msc
    from workloads.operators import matmul

    mod = msc.normalize_prim_func_module(matmul(1, 1, 2))  # about 20 distinct schedules
    search = TaskSearch(mod, llvm_target, seed=0, cost_model=CostModel(), features=CandidateFeatures(), group="m")
    first = search.propose(64)
    assert 0 < len(first) < 64 and len({c.key for c in first}) == len(first)
    # repeats are not rejects: a round that finds only them ends the sampling, rather than asking for a
    # round as many times larger as they were many (292 draws so; bf16's small spaces spent 8-16 s a batch)
    assert search.draws < 3 * 64


def test_queued_seeds_make_up_a_batch_of_their_own(llvm_target):
    from tuner.spaces import metaschedule as msc
    from workloads.operators import matmul

    mod = msc.normalize_prim_func_module(matmul(64, 64, 64))
    donor = TaskSearch(mod, llvm_target, seed=1, cost_model=CostModel(), features=CandidateFeatures(), group="donor")
    search = TaskSearch(mod, llvm_target, seed=2, cost_model=CostModel(), features=CandidateFeatures(), group="m")
    seeds = donor.propose(3)
    assert search.add_transferred([c.schedule.trace for c in seeds], max_seeds=16, replay_seed=1) == [0, 1, 2]
    first = search.propose(8)
    assert [c.key for c in first] == [c.key for c in seeds]  # the seeds alone, not padded with search
    for candidate in first:
        search.observe(candidate, 1e-3)
    assert not {c.key for c in search.propose(8)} & {c.key for c in seeds}
