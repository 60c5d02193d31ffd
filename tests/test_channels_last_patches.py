"""A patch embedding (Swin's, ViT's: a convolution whose stride is its kernel, its image flattened into
a sequence of tokens) computed channels-last: the convolution NHWC, its output reshaped into the tokens
with no transpose between them, the result PyTorch's."""

import numpy as np
import pytest

from tuner.lowering import LoweringOptions
from tuner.tasks.extraction import extract_tasks, lower_workload
from workloads import load_workload

torch = pytest.importorskip("torch")


class _PatchEmbedding(torch.nn.Module):
    """Swin-T's stem in small: 4x4 patches of a 3-channel image, 48 channels each (24 FLOP per byte of the
    image: it pays for its transpose), as tokens, normed."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.patches = torch.nn.Conv2d(3, 48, kernel_size=4, stride=4)
        self.norm = torch.nn.LayerNorm(48)

    def forward(self, image):  # (1, 3, 32, 32)
        return self.norm(self.patches(image).flatten(2).transpose(1, 2))  # (1, 64 tokens, 48)


def test_a_patch_embeddings_convolution_runs_channels_last_into_its_tokens_and_matches_pytorch(llvm_target):
    from lowered_models import error_against_torch

    model = _PatchEmbedding().eval()
    workload = load_workload(model, [(1, 3, 32, 32)])
    lowered = lower_workload(workload, llvm_target, LoweringOptions())
    tasks = extract_tasks(workload, llvm_target, lowered)
    names = [t.name for t in tasks]
    (conv,) = [t for t in tasks if "conv2d" in t.name]
    written = conv.mod["main"].params[-1]  # the kernel's output: its channels innermost (NHWC or tokens)
    assert [int(d) for d in written.shape][-1] == 48, names
    # the image's one transpose to NHWC, none back to NCHW and again to tokens: a strided NCHW
    # convolution vectorised along the width gathers its inputs 4 floats apart (Swin-T's stem: 2.0 ms
    # against 172 us for ConvNeXt's same stem channels-last)
    assert sum("transpose" in n for n in names) <= 1, names
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
    assert error_against_torch(model, lowered, llvm_target, x) < 1e-5
