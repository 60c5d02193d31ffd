"""Channels-last group norms of one channel per group, or of one group, with their sums as products
(tuner.lowering.channel_norms): which norms take that form, and that the model built from it by real
TVM computes what PyTorch computes."""

import numpy as np
import pytest
from lowered_models import error_against_torch

from tuner.lowering import LoweringOptions
from tuner.tasks.extraction import lower_workload
from workloads import load_workload

torch = pytest.importorskip("torch")


class _FirstLayer(torch.nn.Module):
    """wav2vec 2.0's first feature layer in small: a strided 1-D convolution, a group norm of one channel
    per group (its positions' mean and variance per channel), a GELU, the next convolution; then a group
    norm of several channels per group."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Conv1d(1, 32, kernel_size=10, stride=5, bias=False)
        self.norm = torch.nn.GroupNorm(32, 32)
        self.second = torch.nn.Conv1d(32, 32, kernel_size=3, stride=2, bias=False)
        self.grouped_norm = torch.nn.GroupNorm(8, 32)

    def forward(self, x):
        return self.grouped_norm(self.second(torch.nn.functional.gelu(self.norm(self.first(x)))))


def _lowered(llvm_target, options=None):
    torch.manual_seed(0)
    model = _FirstLayer().eval()
    with torch.no_grad():  # a norm's scale and shift away from 1 and 0, as a trained model's are
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    return model, lower_workload(load_workload(model, [(1, 1, 400)]), llvm_target, options)


def test_a_norm_of_a_channel_per_group_sums_by_products_and_matches_pytorch(llvm_target):
    model, lowered = _lowered(llvm_target, LoweringOptions(group_norms_as_products=False))
    scripts = {gv.name_hint: func.script() for gv, func in lowered.functions_items()}
    assert sum("group_norm" in name for name in scripts) == 1, list(scripts)  # the grouped one
    sums = [name for name, script in scripts.items() if "matmul" in name and "conv" not in name]
    assert len(sums) == 2, list(scripts)  # the mean and the variance
    # each product ends at its [N, 1, C] sum: the norm's [N, P, C] steps are no epilogue of it
    assert not [name for name in sums if "subtract" in name or "rsqrt" in name], sums
    x = np.random.default_rng(0).standard_normal((1, 1, 400)).astype("float32") + 3  # a mean to take away
    assert error_against_torch(model, lowered, llvm_target, x) < 1e-5


def test_a_work_dir_tuned_before_the_rewrite_keeps_its_group_norms(llvm_target):
    before = {k: v for k, v in LoweringOptions().as_dict().items() if k != "channel_norms_as_products"}
    kernels = [
        gv.name_hint for gv, _ in _lowered(llvm_target, LoweringOptions.from_record(before))[1].functions_items()
    ]
    assert sum("group_norm" in name for name in kernels) == 2, kernels


def test_the_normalising_kernel_is_finite_on_the_random_inputs_tuning_times_it_with(llvm_target):
    # the tuner times each kernel on random inputs and rejects NaN outputs: a negative "variance" there
    # made every candidate of wav2vec 2.0's normalisation fail, and the kernel ran untuned
    import tvm

    _, lowered = _lowered(llvm_target)
    names = [gv.name_hint for gv, _ in lowered.functions_items() if "rsqrt" in gv.name_hint]
    assert len(names) == 2  # a channel per group, and several
    for name in names:
        func = lowered[name].with_attr("global_symbol", "main")
        built = tvm.compile(tvm.IRModule({"main": func}), target=llvm_target)
        rng = np.random.default_rng(0)
        shapes = [[int(d) for d in p.shape] for p in func.params]
        args = [tvm.runtime.tensor(rng.standard_normal(shape).astype("float32")) for shape in shapes]
        built["main"](*args)
        assert np.all(np.isfinite(args[-1].numpy())), name


class _PoolFormerBlock(torch.nn.Module):
    """PoolFormer's token mixer in small: a group norm of one group (every channel and position), pooling
    minus its input, a 1x1 convolution."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 32, kernel_size=3, padding=1)
        self.norm = torch.nn.GroupNorm(1, 32)
        self.pool = torch.nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
        self.mix = torch.nn.Conv2d(32, 32, kernel_size=1)

    def forward(self, x):
        y = self.norm(self.stem(x))
        return self.mix(self.pool(y) - y)


def test_a_norm_of_one_group_sums_by_products_and_matches_pytorch(llvm_target):
    """As one reduction to a single value per image, one thread walked the whole tensor (PoolFormer's:
    12.3 ms, 58% of the model)."""
    torch.manual_seed(0)
    model = _PoolFormerBlock().eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    lowered = lower_workload(load_workload(model, [(1, 3, 16, 16)]), llvm_target)
    names = [gv.name_hint for gv, _ in lowered.functions_items()]
    assert not [name for name in names if "group_norm" in name], names
    assert len([name for name in names if "matmul" in name and "conv" not in name]) == 2, names
    # the means over the channels end their kernels: no [N, P, C] step computes one again per element
    assert not [name for name in names if "mean" in name and ("subtract" in name or "rsqrt" in name)], names
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32") + 3
    assert error_against_torch(model, lowered, llvm_target, x) < 1e-5


def test_a_norm_of_several_channels_per_group_sums_by_products_and_matches_pytorch(llvm_target):
    """BiT's 32-group norms: each channel's sums as products, then averaged over its group's channels."""
    model, lowered = _lowered(llvm_target)
    with torch.no_grad():
        model.grouped_norm.weight.uniform_(0.5, 1.5)
        model.grouped_norm.bias.uniform_(-0.5, 0.5)
    lowered = lower_workload(load_workload(model, [(1, 1, 400)]), llvm_target)
    names = [gv.name_hint for gv, _ in lowered.functions_items()]
    assert not [name for name in names if "group_norm" in name], names
    assert len([name for name in names if "matmul" in name and "conv" not in name]) == 4, names
    x = np.random.default_rng(0).standard_normal((1, 1, 400)).astype("float32") + 3
    assert error_against_torch(model, lowered, llvm_target, x) < 1e-5
