"""Softmaxes a row per parallel task (tuner.spaces.softmax_rule, named on the kernels by
tuner.lowering.softmax_rows): the kernels the tuner sees carry the rule, and its schedule computes
what the kernel computes, over rows of any length (ViT's 197 tokens, a prime, among them); a softmax fused
with the product that broadcasts it computes each row's share of the product after the row."""

import numpy as np
import pytest
import torch
import tvm
from tvm import te

from tuner import tune
from tuner.lowering import LoweringOptions, lower_model
from tuner.lowering.fast_math import row_softmax
from tuner.lowering.softmax_rows import by_rows
from tuner.spaces.metaschedule import design_spaces, make_context
from tuner.spaces.softmax_rule import SOFTMAX_RULE, schedule_softmax
from tuner.targets import resolve_target
from tuner.tasks.extraction import extract_tasks
from workloads import get_workload


def _by_rows(func: tvm.tirx.PrimFunc) -> tvm.IRModule:
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    quotient = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if "softmax" in sch.get(b).name_hint]
    (sch,) = schedule_softmax(sch, quotient[0])
    return sch.mod


def _run(mod: tvm.IRModule, target, arrays: list[np.ndarray]) -> np.ndarray:
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    tvm.compile(mod, target=target)["main"](*tensors)
    return tensors[-1].numpy()


@pytest.mark.parametrize("safe", [False, True])
def test_a_row_softmax_of_a_prime_length_is_computed_a_row_per_task(llvm_target, safe):
    x = te.placeholder((3, 197, 197), name="x")
    func = by_rows(te.create_prim_func([x, row_softmax(x, True, safe)]))
    assert SOFTMAX_RULE in func.script()
    mod = _by_rows(func)
    assert "T.parallel" in mod.script() and "schedule_rule" in mod.script()
    scores = np.random.default_rng(0).standard_normal((3, 197, 197)).astype("float32") * 4
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    out = _run(mod, llvm_target, [scores, np.zeros_like(scores)])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("length", [256, 100, 49, 7])
def test_rows_of_any_length_reduce_in_independent_chains_and_keep_their_results(llvm_target, length):
    # 256: four vectors of running results, 100: two and 4 values left, 49: one, 7: no whole vector
    x = te.placeholder((6, length), name="x")
    mod = _by_rows(by_rows(te.create_prim_func([x, row_softmax(x, True, True)])))
    scores = np.random.default_rng(1).standard_normal((6, length)).astype("float32") * 4
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    scores[2], expected[2] = -np.inf, 0.0  # a row attention masks whole: zeros, as PyTorch's safe softmax gives
    out = _run(mod, llvm_target, [scores, np.zeros_like(scores)])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-7)


def test_a_row_takes_one_division_and_combines_its_running_results_pairwise(llvm_target):
    # a vector division per 16 quotients cost more than the exponentials; 16 lanes combined one by one
    # made a chain of 16 dependent scalar adds (and as many maxima) per row
    x = te.placeholder((64, 256), name="x")
    mod = _by_rows(by_rows(te.create_prim_func([x, row_softmax(x, True, False)])))
    assembly = tvm.compile(mod, target=llvm_target).mod.inspect_source("asm")
    assert "vdivps" not in assembly
    scalar_steps = sum(assembly.count(f"\t{op}\t") for op in ("vmaxss", "vaddss"))
    assert scalar_steps <= 4, scalar_steps


def test_the_attention_blocks_softmax_kernel_carries_the_rule_and_keeps_its_results(llvm_target):
    workload = get_workload("attention-block")
    (softmax,) = [t for t in extract_tasks(workload, llvm_target) if "softmax" in t.name]
    assert SOFTMAX_RULE in softmax.mod.script()
    (space,) = design_spaces(make_context(softmax.mod, llvm_target, 0))  # what the tuner searches
    assert "T.parallel" in space.mod.script() and "T.vectorized" in space.mod.script()
    func = softmax.mod["main"]
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal([int(d) for d in p.shape]).astype(str(p.dtype)) for p in func.params]
    scheduled = _by_rows(func)
    assert "T.parallel" in scheduled.script()
    unscheduled = tvm.IRModule({"main": func})
    np.testing.assert_allclose(
        _run(scheduled, llvm_target, [a.copy() for a in arrays]),
        _run(unscheduled, llvm_target, [a.copy() for a in arrays]),
        rtol=1e-6,
    )


def test_without_the_option_and_in_work_dirs_tuned_before_softmaxes_keep_metaschedules_space(llvm_target):
    workload = get_workload("attention-block")
    options = LoweringOptions(softmax_by_rows=False)
    tasks = extract_tasks(workload, llvm_target, lower_model(workload.mod, llvm_target, options))
    (softmax,) = [t for t in tasks if "softmax" in t.name]
    assert SOFTMAX_RULE not in softmax.mod.script()
    before = {k: v for k, v in LoweringOptions().as_dict().items() if k != "softmax_by_rows"}
    assert not LoweringOptions.from_record(before).softmax_by_rows
    # the rule is a CPU design space: a GPU's softmaxes keep MetaSchedule's
    gpu = resolve_target("cuda -arch=sm_90")
    (on_gpu,) = [t for t in extract_tasks(workload, gpu) if "softmax" in t.name]
    assert SOFTMAX_RULE not in on_gpu.mod.script()


class SeparableAttention(torch.nn.Module):
    """MobileViTV2's attention: its softmax is fused with the product that broadcasts it over the channels."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.channels = channels
        self.qkv = torch.nn.Conv2d(channels, 1 + 2 * channels, 1)

    def forward(self, x):
        q, k, v = torch.split(self.qkv(x), [1, self.channels, self.channels], dim=1)
        context = (k * torch.softmax(q, dim=-1)).sum(dim=-1, keepdim=True)
        return torch.relu(v) * context


def test_a_softmax_fused_with_a_product_that_broadcasts_it_takes_its_rows_and_the_product_after_each(tmp_path):
    # TVM 0.27 raised an internal error inlining the product, not a ScheduleError: the kernel had no design space
    x = torch.randn(1, 16, 4, 64)
    model = SeparableAttention().eval()
    result = tune(model, example_inputs=(x,), trials=0, work_dir=tmp_path, progress=False)
    (softmax,) = [task for task in result.tasks if "softmax" in task.name]
    assert softmax.analytic and "reverse_compute_at" in softmax.schedule and "parallel" in softmax.schedule
    assert all(task.analytic for task in result.tasks) and "TVM's default schedule" not in result.summary()
    with torch.no_grad():
        np.testing.assert_allclose(result.run(x.numpy()), model(x).numpy(), rtol=1e-4, atol=1e-5)


class MaskedAttention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_a_query_whose_keys_are_all_masked_attends_to_nothing_as_in_pytorch(tmp_path):
    # the safe softmax tested its maximum against -inf, but a maximum starts at the lowest finite value: NaN
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()
    mask[..., 3, :] = False
    model = MaskedAttention().eval()
    result = tune(model, example_inputs=(q, k, v, mask), trials=0, work_dir=tmp_path, progress=False)
    out = result.run(q.numpy(), k.numpy(), v.numpy(), mask.numpy())
    with torch.no_grad():
        expected = model(q, k, v, mask).numpy()
    assert not expected[0, :, 3].any()
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
