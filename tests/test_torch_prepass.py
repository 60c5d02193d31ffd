"""Rewrites of the exported program for TVM's importer (workloads/torch_prepass.py) that are not about
decoders' caches (those: test_hf_decoders.py)."""

import numpy as np
import pytest
import tvm
from tvm import relax

from workloads import load_workload

torch = pytest.importorskip("torch")
F = torch.nn.functional


class Patches(torch.nn.Module):
    """MobileViTV2's unfold and fold: non-overlapping 2x2 patches, mixed across patches, folded back."""

    def forward(self, x):
        patches = F.unfold(x, kernel_size=2, stride=2).reshape(1, 3, 4, -1)
        mixed = patches * 2.0 + patches.mean(dim=-1, keepdim=True) + torch.arange(4.0).reshape(1, 1, 4, 1)
        return F.fold(mixed.reshape(1, 12, -1), output_size=(8, 6), kernel_size=2, stride=2)


def test_non_overlapping_unfold_and_fold_import_and_match():
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 6)).astype("float32")
    _assert_compiled_matches_torch(Patches, x, 1e-6)


def test_overlapping_patches_are_left_to_the_importer():
    from workloads.torch_prepass import prepare_exported_program

    class Overlapping(torch.nn.Module):
        def forward(self, x):
            return F.unfold(x, kernel_size=3, stride=1)

    exported = prepare_exported_program(torch.export.export(Overlapping(), (torch.zeros(1, 2, 5, 5),)))
    targets = [node.target for node in exported.graph.nodes]
    assert torch.ops.aten.im2col.default in targets


class GroupRouting(torch.nn.Module):
    """DeepSeek-V3's routing in small: the best 2 of 4 groups by an unsorted top-k, a mask scattered from
    them, then each row's best 3 scores in those groups (unsorted too) summed by weight."""

    def forward(self, scores):
        groups = scores.view(8, 4, 4).sum(dim=-1)
        chosen = torch.topk(groups, k=2, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(groups).scatter_(1, chosen, 1.0).repeat_interleave(4, dim=1)
        values, indices = torch.topk(scores.masked_fill(mask == 0, -1e9), 3, -1, True, False)
        return (values * indices.float()).sum(dim=-1)


def test_unsorted_topk_is_asked_sorted_and_matches():
    from workloads.torch_prepass import prepare_exported_program

    x = np.random.default_rng(0).standard_normal((8, 16)).astype("float32")
    exported = prepare_exported_program(torch.export.export(GroupRouting(), (torch.from_numpy(x),)))
    topks = [node for node in exported.graph.nodes if node.target == torch.ops.aten.topk.default]
    assert len(topks) == 2 and all(node.args[4] is True and not node.kwargs for node in topks)
    _assert_compiled_matches_torch(GroupRouting, x, 1e-5)


class SplitHeads(torch.nn.Module):
    """Falcon's multi-query split: the last two heads picked by negative index lists, a third list mixed."""

    def forward(self, x):
        heads = x.view(1, 6, 5, 4)
        return heads[..., :-2, :] * heads[..., [-2], :] + heads[..., [-1], :] + heads[:, [0, -6], [-3]].sum()


def test_negative_constant_indices_count_from_the_end():
    x = np.random.default_rng(0).standard_normal((1, 6, 20)).astype("float32")
    _assert_compiled_matches_torch(SplitHeads, x, 1e-5)


class Descending(torch.nn.Module):
    """Funnel's relative positions: integer ranges counted down, by 1 and by 2, gathering rows."""

    def forward(self, table):
        down = torch.arange(8, -1, -1, dtype=torch.long)
        by_two = torch.arange(8, -1, -2, dtype=torch.long)
        return table[down] * 2.0 + table[by_two].sum(dim=0)


def test_descending_integer_arange_keeps_its_length_and_values():
    x = np.random.default_rng(0).standard_normal((9, 3)).astype("float32")
    _assert_compiled_matches_torch(Descending, x, 1e-6)


def _assert_compiled_matches_torch(module_class: type, x: np.ndarray, tolerance: float) -> None:
    """``module_class()`` imported (the pre-pass included), compiled unscheduled and run on ``x``, against PyTorch."""
    workload = load_workload(module_class().eval(), example_inputs=[torch.from_numpy(x)])
    vm = relax.VirtualMachine(tvm.compile(workload.mod, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    with torch.no_grad():
        expected = module_class()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)
