"""Features of candidates, the XGBoost model that ranks them, and the policy that picks which to measure."""

from .features import CandidateFeatures
from .model import CostModel
from .selection import TopKWithExploration

__all__ = ["CandidateFeatures", "CostModel", "TopKWithExploration"]
