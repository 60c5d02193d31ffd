"""A classifier's output channels that no vector divides (1000 classes) are computed over zero weights up to
whole pairs of vectors, and sliced back: the register tile can then be two vectors wide."""

import numpy as np
import pytest

from tuner.lowering import LoweringOptions
from tuner.tasks.extraction import extract_tasks, lower_workload
from workloads import load_workload

torch = pytest.importorskip("torch")


class _Classifier(torch.nn.Module):
    """SqueezeNet's head in small: a 1x1 convolution to 1000 classes over 13 x 13 positions, then a ReLU."""

    def __init__(self, classes: int):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(128, classes, kernel_size=1)

    def forward(self, image):
        return torch.relu(self.conv(image))


@pytest.mark.parametrize("classes, computed", [(1000, 1024), (100, 112)])
def test_a_classifiers_channels_are_padded_to_whole_vectors_and_match_pytorch(classes, computed, llvm_target):
    from lowered_models import error_against_torch

    model = _Classifier(classes).eval()
    workload = load_workload(model, [(1, 128, 13, 13)])
    lowered = lower_workload(workload, llvm_target, LoweringOptions())
    (conv,) = [t for t in extract_tasks(workload, llvm_target, lowered) if "conv2d" in t.name]
    weight = conv.mod["main"].params[1]
    assert int(weight.shape[-1]) == computed  # 1000: two vectors' multiple; 100: 128 would be 28% more work
    x = np.random.default_rng(0).standard_normal((1, 128, 13, 13)).astype("float32")
    assert error_against_torch(model, lowered, llvm_target, x) < 1e-5
