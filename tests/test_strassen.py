"""Large matmuls by constant weights in one level of Strassen's algorithm (tuner.lowering.strassen):
the block algebra, which matmuls take that form, and that a model built from it by real TVM still
computes what PyTorch computes."""

import numpy as np
import pytest
import tvm
from lowered_models import error_against_torch
from tvm import te

from tuner.lowering import LoweringOptions, strassen
from tuner.targets import resolve_target
from tuner.tasks.extraction import lower_workload
from workloads import load_workload

torch = pytest.importorskip("torch")


def test_the_seven_products_add_up_to_the_matmul():
    """The A-side sums, the B-side sums and the output blocks, compiled as the kernels that run them,
    with a numpy product in between, give A @ B: every sign and block of the algorithm is right."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 8)), rng.standard_normal((8, 10))
    data = te.placeholder((6, 8), "float32")
    operands_kernel = tvm.compile(te.create_prim_func([data, strassen.strassen_operands(data)]), "llvm")
    products = te.placeholder((7, 3, 5), "float32")
    output_kernel = tvm.compile(te.create_prim_func([products, strassen.strassen_output(products)]), "llvm")

    operands = tvm.runtime.tensor(np.zeros((7, 3, 4), "float32"))
    operands_kernel(tvm.runtime.tensor(a.astype("float32")), operands)
    multiplied = operands.numpy().astype(np.float64) @ strassen.strassen_weights(b)
    blocks = tvm.runtime.tensor(np.zeros((2, 3, 2, 5), "float32"))
    output_kernel(tvm.runtime.tensor(multiplied.astype("float32")), blocks)
    np.testing.assert_allclose(blocks.numpy().reshape(6, 10), a @ b, rtol=1e-5, atol=1e-5)


class _FeedForward(torch.nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, hidden), torch.nn.Linear(hidden, width)

    def forward(self, x):
        return self.down(torch.nn.functional.relu(self.up(x)))


def _lowered(rows: int, llvm_target, options=None, width: int = 512, hidden: int = 1024):
    torch.manual_seed(0)
    model = _FeedForward(width, hidden).eval()
    workload = load_workload(model, [(1, rows, width)])
    return model, lower_workload(workload, llvm_target, options)


def _batched_products(lowered: tvm.IRModule) -> int:
    """How many matmul kernels multiply a batch of seven products."""
    return sum(
        1
        for gv, func in lowered.functions.items()
        if isinstance(func, tvm.tirx.PrimFunc) and "matmul" in gv.name_hint and "T.Buffer((T.int64(7)," in func.script()
    )


def test_a_feed_forward_block_computes_what_pytorch_computes(llvm_target):
    """Both matmuls of the block take Strassen form; the model, built by TVM (default schedules),
    matches PyTorch with the bias, the ReLU and the second matmul's reshapes in between."""
    model, lowered = _lowered(256, llvm_target)
    assert _batched_products(lowered) == 2
    x = np.random.default_rng(1).standard_normal((1, 256, 512)).astype("float32")
    assert error_against_torch(model, lowered, llvm_target, x) < 1e-5


def test_only_large_matmuls_on_cpus_take_strassen_form(llvm_target):
    """Too few rows for half-size products to run at full speed, an odd dimension, the option off, or
    a GPU target: the matmuls stay as they are."""
    assert _batched_products(_lowered(128, llvm_target)[1]) == 0
    assert _batched_products(_lowered(257, llvm_target)[1]) == 0
    assert _batched_products(_lowered(256, llvm_target, LoweringOptions(strassen=False))[1]) == 0
    _, on_gpu = _lowered(256, resolve_target("cuda -arch=sm_90"))
    assert _batched_products(on_gpu) == 0


def test_a_work_dir_tuned_before_strassen_existed_is_applied_without_it():
    before = {k: v for k, v in LoweringOptions().as_dict().items() if k != "strassen"}
    assert LoweringOptions.from_record(before).strassen is False


class _GatedFeedForward(torch.nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.gate, self.up = torch.nn.Linear(width, hidden, bias=False), torch.nn.Linear(width, hidden, bias=False)

    def forward(self, x):
        return torch.nn.functional.silu(self.gate(x)) * self.up(x)


@pytest.mark.slow  # over 45 s on 2 cores; CI's time goes to the rest
def test_the_output_kernel_loops_over_strassen_blocks_and_computes_what_the_reference_does(llvm_target):
    """A gated feed-forward's two Strassen outputs and the SiLU between them are one kernel; its design
    space loops over the output by Strassen's blocks (rows and columns split in two halves, the columns
    vectorised inside a block), and that schedule, built by TVM, computes what the unscheduled kernel does."""
    from tvm.s_tir import meta_schedule as ms

    from tuner.spaces import schedule_rules
    from tuner.tasks.extraction import extract_tasks

    schedule_rules.register()
    torch.manual_seed(0)
    workload = load_workload(_GatedFeedForward(512, 1056).eval(), [(1, 256, 512)])
    (task,) = [t for t in extract_tasks(workload, llvm_target) if "strassen_output" in t.name]
    context = ms.TuneContext(task.mod, target=llvm_target, space_generator="post-order-apply", task_name=task.name)
    (space,) = context.generate_design_space()
    trace = str(space.trace)
    assert "factors=[2, 128]" in trace and "factors=[2, 528]" in trace and "vectorize" in trace

    rng = np.random.default_rng(2)
    products = [rng.standard_normal((7, 128, 528)).astype("float32") for _ in range(2)]
    outputs = []
    for mod in (task.mod, space.mod):
        out = tvm.runtime.tensor(np.zeros((1, 256, 1056), "float32"))
        tvm.compile(mod, llvm_target)(*(tvm.runtime.tensor(p) for p in products), out)
        outputs.append(out.numpy())
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
