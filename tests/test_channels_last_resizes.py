"""A segmentation head's upsampling, channels-last (``LoweringOptions.channels_last_resizes``): tokens
reshaped into images and their resizes computed NHWC with the convolutions, the transposes between
them gone, the result PyTorch's."""

import numpy as np
import pytest

from tuner.lowering import LoweringOptions
from tuner.tasks.extraction import extract_tasks, lower_workload
from workloads import load_workload

torch = pytest.importorskip("torch")


class _SegmentationHead(torch.nn.Module):
    """SegFormer's decode head in small: two stages' tokens (8x8 and 4x4 positions) each made an image
    (``transpose(1, 2).reshape``), upsampled to the first stage's size (the first to its own size),
    concatenated and fused by 1x1 convolutions."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = torch.nn.Linear(16, 32), torch.nn.Linear(16, 32)
        self.fuse, self.classify = torch.nn.Conv2d(64, 32, 1), torch.nn.Conv2d(32, 8, 1)

    def forward(self, tokens):  # (1, 64, 16): 8x8 positions of 16 channels
        coarse = tokens.reshape(1, 16, 4, 16).mean(2)  # 4x4 positions
        images = []
        for mlp, x, side in ((self.first, tokens, 8), (self.second, coarse, 4)):
            image = mlp(x).transpose(1, 2).reshape(1, 32, side, side)
            images.append(torch.nn.functional.interpolate(image, size=(8, 8), mode="bilinear", align_corners=False))
        return self.classify(torch.relu(self.fuse(torch.cat(images, dim=1))))


@pytest.mark.parametrize("resizes", [True, False], ids=["channels-last", "as-before"])
def test_a_segmentation_heads_resizes_run_channels_last_and_match_pytorch(resizes, llvm_target):
    from lowered_models import error_against_torch

    head = _SegmentationHead().eval()
    workload = load_workload(head, [(1, 64, 16)])
    lowered = lower_workload(workload, llvm_target, LoweringOptions(channels_last_resizes=resizes))
    tasks = extract_tasks(workload, llvm_target, lowered)
    names = [t.name for t in tasks]
    resizes_read = [t.mod["main"].params[0] for t in tasks if "resize" in t.name]
    if resizes:
        # the 8x8 image's resize to 8x8 is gone; the other reads its tokens' channels innermost (NHWC)
        assert len(resizes_read) == 1 and [int(d) for d in resizes_read[0].shape][-1] == 32, names
        assert sum("transpose" in n for n in names) <= 1, names  # at most the output's, back to NCHW
    else:
        assert len(resizes_read) == 2 and sum("transpose" in n for n in names) >= 2, names
    x = np.random.default_rng(0).standard_normal((1, 64, 16)).astype("float32")
    assert error_against_torch(head, lowered, llvm_target, x) < 1e-5
