"""The search proposes distinct, never-measured schedules, and knows when a space runs dry."""

import faulty
from costmodel import CandidateFeatures, CostModel
from tuner.search import TaskSearch


def test_a_small_space_is_sampled_without_spinning(llvm_target):
    search = TaskSearch(faulty.copy(64), llvm_target, seed=0, cost_model=CostModel(), features=CandidateFeatures(), group="copy")
    first = search.propose(200)
    assert 0 < len(first) < 200 and len({c.key for c in first}) == len(first)
    assert search.draws < 200 * 4  # gives up once samples repeat, not after 64 tries per missing one
    for candidate in first:
        search.observe(candidate, 1e-6)
    again = search.propose(200)
    assert not ({c.key for c in again} & {c.key for c in first})
