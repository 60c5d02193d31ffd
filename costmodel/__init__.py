"""The cost model: candidates' features, the XGBoost model ranking them, and the Trimmer filter.

Also its measured rank quality and the policies that pick which candidates to measure (search's
top-k, the Trimmer filter)."""

from .features import CandidateFeatures
from .model import CostModel
from .quality import RankQuality, kendall_tau, rank_quality
from .selection import TopKWithExploration
from .trimmer import CandidateFilter, FilterDecision, FilterLedger, FilterSettings, TrimmerFilter

__all__ = [
    "CandidateFeatures",
    "CandidateFilter",
    "CostModel",
    "FilterDecision",
    "FilterLedger",
    "FilterSettings",
    "RankQuality",
    "TopKWithExploration",
    "TrimmerFilter",
    "kendall_tau",
    "rank_quality",
]
