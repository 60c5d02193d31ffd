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
    workload = load_workload(Patches().eval(), example_inputs=[torch.from_numpy(x)])
    vm = relax.VirtualMachine(tvm.compile(workload.mod, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    with torch.no_grad():
        expected = Patches()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_overlapping_patches_are_left_to_the_importer():
    from workloads.torch_prepass import prepare_exported_program

    class Overlapping(torch.nn.Module):
        def forward(self, x):
            return F.unfold(x, kernel_size=3, stride=1)

    exported = prepare_exported_program(torch.export.export(Overlapping(), (torch.zeros(1, 2, 5, 5),)))
    targets = [node.target for node in exported.graph.nodes]
    assert torch.ops.aten.im2col.default in targets
