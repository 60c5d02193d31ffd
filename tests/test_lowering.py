"""The inference lowering (tuner.lowering): what becomes a kernel, and that the lowered model still
computes what the PyTorch model computes, built by real TVM."""

import math

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from codegen.build import build_lowered_model
from tuner.lowering import LoweringOptions, lower_model
from tuner.spaces import metaschedule as msc
from tuner.tasks.extraction import extract_tasks, lower_workload
from workloads import get_workload, load_workload

torch = pytest.importorskip("torch")


def _run(lowered, target, inputs, database=None):
    executable = build_lowered_model(lowered, target, database or ms.database.MemoryDatabase())
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return out.numpy(), executable


def _relative_error(got, expected):
    return float(np.max(np.abs(got.astype(np.float64) - expected)) / np.max(np.abs(expected)))


def _reduces(task) -> bool:
    return any(block.reduction for block in msc.kernel_blocks(task.mod))


@pytest.mark.parametrize("name", ["tiny-resnet", "attention-block"])
def test_the_lowered_model_computes_what_pytorch_computes(name, llvm_target):
    workload = get_workload(name)
    x = np.random.default_rng(0).standard_normal(workload.inputs[0].shape).astype("float32")
    got, _ = _run(lower_workload(workload, llvm_target), llvm_target, [x])
    assert _relative_error(got, workload.reference(x)) < 1e-5


def test_batch_norms_fold_into_the_convolutions_and_epilogues_fuse(llvm_target):
    tasks = extract_tasks(get_workload("tiny-resnet"), llvm_target)
    assert not [t.name for t in tasks if "batch_norm" in t.name]
    convolutions = [t for t in tasks if "conv2d" in t.name]
    assert len(convolutions) == 6 and all("add" in t.name for t in convolutions)  # bias (the folded norm), residual
    assert sum("relu" in t.name for t in convolutions) == 5  # all but the shortcut's


def test_every_kernel_of_the_attention_block_computes_something(llvm_target):
    """torch's MultiheadAttention imports as 21 kernels, 10 of them reshapes and transposes; lowered,
    each layout change is index arithmetic inside the kernel that reads it. (Channels-last
    convolutions are left out here: they add the image's own layout changes, tested below.)"""
    workload = get_workload("attention-block")
    tasks = extract_tasks(
        workload,
        llvm_target,
        lower_model(workload.mod, llvm_target, LoweringOptions(channels_last=False, fuse_layout_into_attention=True)),
    )
    movers = [t.name for t in tasks if not _reduces(t)]
    assert len(movers) == 1 and "add" in movers[0], movers  # the residual add: convolutions take no producers
    assert len(tasks) <= 10
    softmax = [t for t in tasks if "softmax" in t.name]
    assert len(softmax) == 1 and "safe_softmax" in softmax[0].name  # the -inf row check is in the softmax kernel
    assert not [t.name for t in tasks if "where" in t.name or "equal" in t.name]


def test_attention_s_products_can_keep_their_layout_kernels_apart(llvm_target):
    # by default (fuse_layout_into_attention=False) the scores' and the context's matmuls read plain
    # operands, their heads' transposes kernels of their own; the weights' products keep theirs
    workload = get_workload("attention-block")
    options = LoweringOptions(channels_last=False)
    names = [t.name for t in extract_tasks(workload, llvm_target, lower_model(workload.mod, llvm_target, options))]
    plain = [n for n in names if "matmul" in n and "layout" not in n]
    assert len(plain) == 2 and all("add" not in n for n in plain), names  # scores and context
    assert sum("layout_matmul" in n for n in names) == 2, names  # the projections in and out
    before = {k: v for k, v in LoweringOptions().as_dict().items() if k != "fuse_layout_into_attention"}
    assert LoweringOptions.from_record(before).fuse_layout_into_attention  # a work dir tuned before keeps its kernels


def test_convolutions_run_channels_last_with_one_transpose_at_the_input(llvm_target):
    """NCHW models get NHWC convolutions on a CPU; the transposes between them cancel, and only the
    image's own (NCHW in) is left as a kernel that moves data."""
    tasks = extract_tasks(get_workload("tiny-resnet"), llvm_target)
    movers = [t for t in tasks if not _reduces(t)]
    assert len(movers) == 1 and "transpose" in movers[0].name, [t.name for t in movers]
    convolution = next(t for t in tasks if "conv2d" in t.name)
    data = convolution.mod["main"].params[0]
    assert [int(d) for d in data.shape][-1] in (3, 16)  # channels last (3 in, 16 after the stem)


@pytest.mark.parametrize(
    ("module", "shape", "channels_last"),
    [
        (lambda: torch.nn.Conv2d(144, 144, 3, padding=1, groups=144), (1, 144, 56, 56), False),  # 2 FLOP/B
        (lambda: torch.nn.Conv2d(512, 128, 1), (1, 512, 28, 28), True),  # 51 FLOP/B
    ],
    ids=["depthwise", "pointwise"],
)
def test_a_lone_convolution_goes_channels_last_only_where_its_work_outweighs_the_transposes(
    module, shape, channels_last, llvm_target
):
    """Alone, a convolution needs a transpose at its input and its output: a depthwise one does too
    little arithmetic to pay for them and stays NCHW, a pointwise one over 512 channels pays."""
    conv = module().eval()
    workload = load_workload(conv, [shape])
    lowered = lower_workload(workload, llvm_target)
    names = [t.name for t in extract_tasks(workload, llvm_target, lowered)]
    assert (
        (len(names) == 3 and sum("transpose" in n for n in names) == 2)
        if channels_last
        else names == ["fused_conv2d_add1"]
    ), names
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    got, _ = _run(lowered, llvm_target, [x])
    with torch.no_grad():
        expected = conv(torch.from_numpy(x)).numpy().astype(np.float64)
    assert _relative_error(got, expected) < 1e-5


def test_output_channels_are_padded_to_whole_vectors_where_that_costs_little(llvm_target):
    """A channels-last convolution vectorises along its output channels: 120 of them become 128
    (zero weights, the result sliced back); 24 would need a third more work and stay 24."""
    rng = np.random.default_rng(0)
    modules = {channels: torch.nn.Conv2d(16, channels, 3, padding=1).eval() for channels in (120, 24)}
    for channels, module in modules.items():
        workload = load_workload(module, [(1, 16, 8, 8)])
        lowered = lower_workload(workload, llvm_target)
        (conv,) = [t for t in extract_tasks(workload, llvm_target, lowered) if "conv2d" in t.name]
        weight_channels = max(
            int(p.shape[-1]) for p in conv.mod["main"].params if len(p.shape) == 4 and int(p.shape[0]) == 3
        )
        assert weight_channels == {120: 128, 24: 24}[channels]
        x = rng.standard_normal((1, 16, 8, 8)).astype("float32")
        got, _ = _run(lowered, llvm_target, [x])
        with torch.no_grad():
            expected = module(torch.from_numpy(x)).numpy().astype(np.float64)
        assert got.shape == expected.shape and _relative_error(got, expected) < 1e-5


def test_a_broadcast_weight_is_not_materialised(llvm_target):
    """MultiheadAttention's input projection imports as a batched GEMV against 256 copies of its
    64x192 weight (3.1M floats once folded); no kernel argument should exceed the attention scores."""
    tasks = extract_tasks(get_workload("attention-block"), llvm_target)
    biggest = max(int(np.prod([int(d) for d in p.shape])) for t in tasks for p in t.mod["main"].params)
    assert biggest <= 4 * 256 * 256


def _activations_module():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 256), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(relax.op.nn.softmax(x, axis=-1))
            g = bb.emit(relax.op.nn.gelu(x))
            sig = bb.emit(relax.op.sigmoid(x))
            silu = bb.emit(relax.op.nn.silu(x))
            tanh = bb.emit(relax.op.add(relax.op.tanh(x), relax.op.nn.gelu_tanh(x)))
            out = bb.emit_output(relax.op.add(relax.op.add(relax.op.add(s, g), relax.op.add(sig, silu)), tanh))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("fast_math", [True, False])
def test_fast_math_replaces_libm_calls_and_stays_accurate(fast_math, llvm_target):
    mod = _activations_module()
    lowered = lower_model(mod, llvm_target, LoweringOptions(fast_math=fast_math))
    scripts = "".join(f.script() for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    libm_calls = [call for call in ("T.exp(", "T.erf(", "T.sigmoid(", "T.tanh(") if call in scripts]
    assert (libm_calls == []) == fast_math, libm_calls
    x = (np.random.default_rng(0).standard_normal((4, 256)) * 4).astype("float32")
    got, _ = _run(lowered, llvm_target, [x])
    t = torch.from_numpy(x.astype(np.float64))
    expected = (
        torch.softmax(t, -1)
        + torch.nn.functional.gelu(t)
        + torch.sigmoid(t)
        + torch.nn.functional.silu(t)
        + torch.tanh(t)
        + torch.nn.functional.gelu(t, approximate="tanh")
    ).numpy()
    assert _relative_error(got, expected) < 1e-5


def _two_matmuls_module(shared_op):
    """x -> shared_op -> two matmuls, each read by the output."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((32, 64), "float32"))
    rng = np.random.default_rng(0)
    w1, w2 = (relax.const(rng.standard_normal((32, 16)).astype("float32")) for _ in range(2))
    with bb.function("main", [x]):
        with bb.dataflow():
            shared = bb.emit(shared_op(x))
            out = bb.emit_output(relax.op.add(relax.op.matmul(shared, w1), relax.op.matmul(shared, w2)))
        bb.emit_func_output(out)
    return bb.get()


def _task_names(mod, target):
    lowered = lower_model(mod, target)
    return [t.task_name for t in ms.relax_integration.extract_tasks(lowered, target)], lowered


def test_a_transpose_read_by_two_matmuls_is_copied_into_both(llvm_target):
    mod = _two_matmuls_module(lambda x: relax.op.permute_dims(x))
    names, lowered = _task_names(mod, llvm_target)
    assert not [n for n in names if "transpose" in n and "matmul" not in n], names
    x = np.random.default_rng(1).standard_normal((32, 64)).astype("float32")
    got, _ = _run(lowered, llvm_target, [x])
    reference, _ = _run(lower_model(mod, llvm_target, LoweringOptions(fuse_layout=False)), llvm_target, [x])
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)


def test_arithmetic_read_by_two_kernels_stays_a_kernel_of_its_own(llvm_target):
    mod = _two_matmuls_module(lambda x: relax.op.permute_dims(relax.op.multiply(x, relax.const(2.0, "float32"))))
    names, _ = _task_names(mod, llvm_target)
    assert any("multiply" in n and "matmul" not in n for n in names), names


def test_an_activation_behind_a_reshape_becomes_the_matmul_epilogue(llvm_target):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 32), "float32"))
    w = relax.const(np.random.default_rng(0).standard_normal((32, 48)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.reshape(relax.op.matmul(x, w), (1, 8, 8, 48)))
            out = bb.emit_output(relax.op.nn.gelu(y))
        bb.emit_func_output(out)
    names, _ = _task_names(bb.get(), llvm_target)
    assert [n for n in names if "gelu" in n] == [n for n in names if "matmul" in n] != [], names


def test_an_activation_between_a_batch_dimensions_insertion_and_removal_becomes_the_matmul_epilogue(llvm_target):
    """A transformer's FFN as imported: (128, 256) given a batch dimension for the GELU and had it taken
    away for the next matmul. The reshapes become an expand_dims and a squeeze; the GELU, moved above the
    first, meets no layout step between it and the matmul, and the squeeze cancels the expand_dims
    (BERT's twelve GELU kernels of their own, Swin-T's four: 0.8 ms of its 29)."""
    bb = relax.BlockBuilder()
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((128, 64), "float32"))
    w1 = rng.standard_normal((64, 256)).astype("float32") / 8
    w2 = rng.standard_normal((256, 32)).astype("float32") / 16
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.reshape(relax.op.matmul(x, relax.const(w1)), (1, 128, 256)))
            g = bb.emit(relax.op.reshape(relax.op.nn.gelu(y), (128, 256)))
            out = bb.emit_output(relax.op.matmul(g, relax.const(w2)))
        bb.emit_func_output(out)
    names, lowered = _task_names(bb.get(), llvm_target)
    assert [n for n in names if "gelu" in n] == [n for n in names if "matmul" in n and "gelu" in n] != [], names
    assert not [n for n in names if "expand_dims" in n or "squeeze" in n], names
    data = rng.standard_normal((128, 64)).astype("float32")
    got, _ = _run(lowered, llvm_target, [data])
    hidden = data @ w1
    gelu = 0.5 * hidden * (1 + np.vectorize(math.erf)(hidden / math.sqrt(2)))
    np.testing.assert_allclose(got, gelu @ w2, rtol=1e-4, atol=1e-4)


def test_tuned_weight_layouts_are_transformed_once_at_compile_time(llvm_target):
    """MetaSchedule's schedules for CPU convolutions read their weights in a layout of their own;
    compile transforms the constant weights, so no layout transform runs per call."""
    workload = get_workload("tiny-resnet")
    lowered = lower_workload(workload, llvm_target)
    database = ms.database.MemoryDatabase()
    rewritten = 0
    for task in extract_tasks(workload, llvm_target, lowered):
        context = msc.make_context(task.mod, llvm_target, seed=1)
        spaces, postprocs = msc.design_spaces(context), msc.postprocessors(context)
        sch = next(s for seed in range(1, 50) if (s := msc.sample(task.mod, spaces[0], seed, postprocs)) is not None)
        rewritten += "layout_rewrite" in sch.mod.script()
        record = database.commit_workload(task.mod)
        database.commit_tuning_record(ms.database.TuningRecord(sch.trace, record, [1.0], llvm_target, None))
    assert rewritten >= 5  # the convolutions and the classifier's matmul
    x = np.random.default_rng(0).standard_normal(workload.inputs[0].shape).astype("float32")
    got, executable = _run(lowered, llvm_target, [x], database)
    assert "weight_prepack" not in executable.as_text()  # (the tuned kernels are called *_prepacked)
    assert _relative_error(got, workload.reference(x)) < 1e-5


def test_a_residual_reshaped_around_a_matmul_keeps_the_matmul_schedulable(llvm_target):
    """BERT's residual add: the activation (1, 128, 64) reshaped to (128, 64) for the matmul's
    epilogue. As a TE reshape it reads ``p0[0, (j // 64 + i) % 128, j % 64]``, which MetaSchedule
    does not inline, and the matmul's design space then fails to generate; as a squeeze it does."""
    from tuner.spaces import metaschedule as msc

    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(64, 64)

        def forward(self, x):
            return self.linear(x.reshape(128, 64)).reshape(1, 128, 64) + x

    module = Residual().eval()
    workload = load_workload(module, [(1, 128, 64)])
    lowered = lower_workload(workload, llvm_target)
    (matmul,) = [t for t in extract_tasks(workload, llvm_target, lowered) if "matmul" in t.name]
    assert "T.int64(128)) %" not in matmul.mod.script() and "% T.int64(128)" not in matmul.mod.script()
    # the tuner's own context: TuneContext's Python constructor imports TVM's tensor intrinsics (~40 s)
    assert msc.design_spaces(msc.make_context(matmul.mod, llvm_target, seed=1))
    x = np.random.default_rng(0).standard_normal((1, 128, 64)).astype("float32")
    got, _ = _run(lowered, llvm_target, [x])
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy().astype(np.float64)
    assert _relative_error(got, expected) < 1e-5


@pytest.mark.parametrize(("pool", "becomes_mean"), [((1280, True), True), ((7, False), True), ((2, False), False)])
def test_a_pool_whose_window_covers_the_input_is_a_mean(pool, becomes_mean, llvm_target):
    """transformers' EfficientNet pools 7x7 maps with AvgPool2d(1280, ceil_mode=True): the window is
    clipped to the input, so it is the mean over it, which a mean kernel computes reading it once."""
    from lowered_models import error_against_torch

    from tuner.tasks.extraction import load_model

    kernel, ceil_mode = pool
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.AvgPool2d(kernel, ceil_mode=ceil_mode), torch.nn.Flatten()
    ).eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 7, 7)).astype("float32")
    workload = load_model(model, [torch.from_numpy(x)])
    lowered = lower_workload(workload, llvm_target)
    names = [t.name for t in extract_tasks(workload, llvm_target, lowered)]
    assert any("pool" in n for n in names) != becomes_mean, names
    assert error_against_torch(model, lowered, llvm_target, x) < 1e-5


@pytest.mark.parametrize(
    ("exponent", "becomes_products"),
    [
        pytest.param(2.0, True, marks=pytest.mark.slow),
        (3.0, True),
        pytest.param(4.0, True, marks=pytest.mark.slow),
        (2.5, False),
    ],
)
def test_whole_powers_are_multiplies(exponent, becomes_products, llvm_target):
    """GPT-2's tanh GELU cubes its input with torch.pow: one libm call per element unless it is
    written as multiplies."""
    from lowered_models import error_against_torch

    from tuner.tasks.extraction import load_model

    class TanhGelu(torch.nn.Module):
        def forward(self, x):
            return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x.abs(), exponent))))

    model = TanhGelu().eval()
    x = np.random.default_rng(0).standard_normal((4, 256)).astype("float32")
    workload = load_model(model, [torch.from_numpy(x)])
    lowered = lower_workload(workload, llvm_target)
    scripts = "".join(f.script() for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    assert ("T.pow(" not in scripts) == becomes_products
    assert error_against_torch(model, lowered, llvm_target, x) < 1e-5


@pytest.mark.parametrize("with_indices", [False, True])
def test_a_top_one_is_a_max_not_a_sort(with_indices, llvm_target):
    """torch's max(dim) comes in as topk with k=1, which TVM sorts in a kernel of one thread (HF Hiera's
    query pooling: 23 of the model's 85 ms); as a max (and an argmax where its indices are read)."""
    from lowered_models import error_against_torch

    from tuner.tasks.extraction import load_model

    class TopOne(torch.nn.Module):
        def forward(self, x):
            values, indices = torch.max(x.view(1, 4, 49, 32), dim=1)
            return values + (indices.float() if with_indices else 0.0)

    model = TopOne().eval()
    x = np.random.default_rng(0).standard_normal((1, 4 * 49, 32)).astype("float32")
    workload = load_model(model, [torch.from_numpy(x)])
    lowered = lower_workload(workload, llvm_target)
    names = [t.name for t in extract_tasks(workload, llvm_target, lowered)]
    assert not [n for n in names if "topk" in n or "sort" in n], names
    assert any("arg" in n for n in names) == with_indices, names
    assert error_against_torch(model, lowered, llvm_target, x) < 1e-5
