"""bfloat16 kernels as the lowering makes them: which unit takes a product, convolutions over image
rows laid end to end (their window in one AMX call), products over patches, epilogues merged into the
write-back, what is copied and what is a view, channels padded to whole AMX steps, attention's
products of two activations."""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
import torch
import tvm
from bf16_builds import (
    BF16_THROUGHOUT,
    EACH_UNIT,
    bf16_array,
    built_tiled,
    needs_amx,
    needs_bf16,
    run_built,
    te_module,
    torch_conv_nhwc,
)
from tvm import te

from codegen.bf16_dot import AMX, AVX512, register_if_ours
from common.host import host_has_amx
from tuner.lowering.bf16.kernels import bf16_conv2d_nhwc, bf16_dense, pack_conv_weight, pack_dense_weight
from tuner.lowering.bf16.precision import host_has_bf16
from tuner.spaces.bf16_rule import _tile, padded_rows, tile_shapes
from tuner.targets import bf16_unit, resolve_target


def test_amx_takes_the_products_over_a_whole_step_of_the_reduction_and_avx512_the_rest() -> None:
    from tvm import relax

    from tuner.lowering.bf16.products import Bfloat16Products
    from tuner.spaces.bf16_rule import UNIT_ANNOTATION

    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 16, 16), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            narrow = relax.op.nn.conv2d(
                x, relax.const(np.ones((1, 1, 16, 32), np.float32)), data_layout="NHWC", kernel_layout="HWIO"
            )
            out = relax.op.nn.conv2d(
                builder.emit(narrow),
                relax.const(np.ones((1, 1, 32, 32), np.float32)),
                data_layout="NHWC",
                kernel_layout="HWIO",
            )
            out = builder.emit_output(builder.emit(out))
        builder.emit_func_output(out)
    text = Bfloat16Products(unit=AMX)(builder.get()).script()
    # 32 channels: one step; 16 (a 1x1 window: no patches to gather): not one
    assert text.count(f'"{UNIT_ANNOTATION}": "{AMX}"') == 1 and text.count(f'"{UNIT_ANNOTATION}": "{AVX512}"') == 1


@needs_amx
@pytest.mark.parametrize(
    ("size", "kernel", "stride", "pad", "channels"),
    [(7, 3, 1, 1, 32), (8, 1, 2, 0, 32), (14, 3, 2, 1, 32), (7, 1, 1, 0, 32), (8, 1, 1, 0, 32), (10, 3, 1, 1, 96)],
)
def test_a_convolution_over_the_image_rows_end_to_end_is_the_convolution(size, kernel, stride, pad, channels) -> None:
    from tuner.lowering.bf16.flat import bf16_conv2d_flat, flat_rows

    outputs = 40 if size != 8 else 48  # 40 outputs: 48 computed, 40 gathered back
    image, weight = bf16_array((1, size, size, channels), 1), bf16_array((kernel, kernel, channels, outputs), 2)
    packed = pack_conv_weight(weight)
    rows = flat_rows((size, size), (kernel, kernel), stride, (pad,) * 4, packed.shape[2], AMX)
    assert rows is not None
    image_t = te.placeholder(image.shape, "bfloat16", name="image")
    kernel_t = te.placeholder(packed.shape, "bfloat16", name="kernel")
    conv = bf16_conv2d_flat(image_t, kernel_t, stride, (pad,) * 4, rows, outputs, AMX)
    shapes = tile_shapes(rows, packed.shape[2], AMX)
    built = built_tiled(te_module([image_t, kernel_t, conv]), "bf16_conv2d", *shapes[0], AMX)
    # 1x1 convolutions over 8x8 into 48 channels drop nothing: the gather is a reshape, merged into the write-back
    sch = tvm.s_tir.Schedule(te_module([image_t, kernel_t, conv]), seed=1)
    _tile(sch, sch.get_sblock("bf16_conv2d"), *shapes[0], AMX)
    assert ('"bf16_rows"' in sch.mod.script()) == (size != 8)
    # the gather back to the image done tile by tile, in the product's loop, where the GEMM's rows are the
    # image's positions one to one (1x1); a pass of its own where columns between image rows are dropped
    assert sch.mod.script().count("T.parallel(") == (3 if kernel == 3 else 2)  # with the copy that pads
    # a stride-1 window: each micro-kernel call sums over all its taps
    assert (f"_w{kernel}x{kernel}c" in sch.mod.script()) == (stride == 1 and kernel > 1)
    got = run_built(built, [image, packed], tuple(int(d) for d in conv.shape))
    np.testing.assert_allclose(got, torch_conv_nhwc(image, weight, stride, pad), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("unit", [AVX512, AMX])
def test_a_residual_block_s_whole_epilogue_merges_into_the_product_s_write_back(unit: str) -> None:
    # bias, the residual (bf16, cast back to fp32), ReLU and the next layer's cast: one pass over the
    # output, not a block (a pass over the fp32 output) each
    if not (host_has_amx() if unit == AMX else host_has_bf16()):
        pytest.skip(f"this CPU has no {unit} unit")
    channels, outputs, size = 32, 48, 8
    image, weight = bf16_array((1, size, size, channels), 1), bf16_array((1, 1, channels, outputs), 2)
    residual = bf16_array((1, size, size, outputs), 3)
    image_t = te.placeholder(image.shape, "bfloat16", name="image")
    kernel_t = te.placeholder(pack_conv_weight(weight).shape, "bfloat16", name="kernel")
    residual_t = te.placeholder(residual.shape, "bfloat16", name="residual")
    conv = bf16_conv2d_nhwc(image_t, kernel_t, 1, (0, 0, 0, 0), unit=unit)
    biased = te.compute(conv.shape, lambda *i: conv[i] + tvm.tirx.const(0.5, "float32"), name="bias")
    widened = te.compute(residual.shape, lambda *i: residual_t[i].astype("float32"), name="widen")
    summed = te.compute(conv.shape, lambda *i: biased[i] + widened[i], name="residual_sum")
    relu = te.compute(conv.shape, lambda *i: tvm.tirx.max(summed[i], tvm.tirx.const(0, "float32")), name="relu")
    out = te.compute(conv.shape, lambda *i: relu[i].astype("bfloat16"), name="next_cast")
    module = te_module([image_t, kernel_t, residual_t, out])
    tile = tile_shapes(size, outputs // 16, unit)[0]
    sch = tvm.s_tir.Schedule(module, seed=1)
    _tile(sch, sch.get_sblock("bf16_conv2d"), *tile, unit)
    for merged in ("bias", "widen", "residual_sum", "relu", "next_cast"):
        assert f'"{merged}"' not in sch.mod.script(), merged
    built = tvm.compile(sch.mod, target=resolve_target("llvm"))
    arrays = [image, pack_conv_weight(weight), residual]
    got = tvm.runtime.tensor(np.zeros(residual.shape, ml_dtypes.bfloat16), tvm.cpu())
    built["main"](*(tvm.runtime.tensor(a, tvm.cpu()) for a in arrays), got)
    product = image.astype(np.float32).reshape(-1, channels) @ weight.astype(np.float32).reshape(channels, outputs)
    expected = np.maximum(product.reshape(residual.shape) + 0.5 + residual.astype(np.float32), 0)
    np.testing.assert_allclose(got.numpy().astype(np.float32), expected, rtol=1e-2, atol=1e-2)


@needs_bf16
def test_an_epilogue_reading_the_product_twice_stays_tileable() -> None:
    # GELU's x * phi(x): the product's consumer reads it and a block computed from it, which must not be
    # merged away (ConvNeXt-T's three GELU kernels lost their design space and ran at TVM's default)
    m, n, k = 16, 32, 64
    data_t = te.placeholder((m, k), "bfloat16", name="data")
    packed_t = te.placeholder((n // 16, k // 2, 16, 2), "bfloat16", name="packed")
    product = bf16_dense(data_t, packed_t, unit=bf16_unit(resolve_target("llvm")) or AVX512)
    biased = te.compute(product.shape, lambda *i: product[i] + tvm.tirx.const(1, "float32"), name="bias")
    gate = te.compute(product.shape, lambda *i: tvm.tirx.max(biased[i], tvm.tirx.const(0, "float32")), name="gate")
    out = te.compute(product.shape, lambda *i: (biased[i] * gate[i]).astype("bfloat16"), name="gelu_like")
    module = te_module([data_t, packed_t, out])
    unit = bf16_unit(resolve_target("llvm")) or AVX512
    sch = tvm.s_tir.Schedule(module, seed=1)
    _tile(sch, sch.get_sblock("bf16_dense"), *tile_shapes(m, n // 16, unit)[0], unit)
    data, weight = bf16_array((m, k), 1), bf16_array((k, n), 2)
    got = tvm.runtime.tensor(np.zeros((m, n), ml_dtypes.bfloat16), tvm.cpu())
    built = tvm.compile(sch.mod, target=resolve_target("llvm"))
    built["main"](tvm.runtime.tensor(data, tvm.cpu()), tvm.runtime.tensor(pack_dense_weight(weight), tvm.cpu()), got)
    y = data.astype(np.float32) @ weight.astype(np.float32) + 1
    np.testing.assert_allclose(got.numpy().astype(np.float32), y * np.maximum(y, 0), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    ("size", "kernel", "stride", "pad", "unit", "channels_first"),
    [(20, 7, 2, 3, AVX512, False), (32, 16, 16, 0, AMX, False), (20, 3, 2, 1, AMX, False), (21, 3, 2, 1, AMX, True)],
)
def test_a_first_convolution_is_a_product_over_its_window_s_patches(size, kernel, stride, pad, unit, channels_first):
    # channels_first: the model's input (NCHW) transposed for it, read through a padded bf16 copy of its own
    from tvm import relax

    from tuner.lowering.bf16.products import Bfloat16Products

    image = np.random.default_rng(1).standard_normal((1, size, size, 3)).astype(np.float32)
    weight = np.random.default_rng(2).standard_normal((kernel, kernel, 3, 40)).astype(np.float32)
    builder = relax.BlockBuilder()
    given = image.transpose(0, 3, 1, 2).copy() if channels_first else image
    x = relax.Var("x", relax.TensorType(given.shape, "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            data = builder.emit(relax.op.permute_dims(x, [0, 2, 3, 1])) if channels_first else x
            conv = relax.op.nn.conv2d(
                data, relax.const(weight), strides=stride, padding=pad, data_layout="NHWC", kernel_layout="HWIO"
            )
            out = builder.emit_output(builder.emit(conv))
        builder.emit_func_output(out)
    lowered = Bfloat16Products(unit, image_windows=False)(builder.get())  # patches (image windows: their own test)
    lowered = relax.transform.DeadCodeElimination(["main"])(lowered)
    assert "bf16_patches" in lowered.script()
    assert ("bf16_padded_image" in lowered.script()) == channels_first
    assert "permute_dims" not in lowered.script()  # the input's transpose is the padded copy's
    if (unit, kernel) == (AMX, 3):  # 3 window rows of 16 (9 values) and a zero one: two whole steps of 32
        assert 'T.int64(4), T.int64(16)), "bfloat16")' in lowered.script()
    run = relax.VirtualMachine(tvm.compile(lowered, target="llvm"), tvm.cpu())
    got = run["main"](tvm.runtime.tensor(given)).numpy()
    rounded = [a.astype(ml_dtypes.bfloat16) for a in (image, weight)]
    np.testing.assert_allclose(got, torch_conv_nhwc(*rounded, stride, pad), rtol=1e-4, atol=1e-3)


@needs_bf16
def test_a_first_convolution_over_patches_and_a_1x1_one_copy_nothing_and_merge_their_epilogues() -> None:
    # the patches' reshape stays a view (not a copy inside the product), and the product writes the
    # image itself, so that its bias, activation and the next layer's cast merge into its write-back;
    # on AMX a 1x1 convolution over a 14x14 image (a GEMM over its 196 positions) reads its input as it is
    from tvm import relax

    from tuner.tasks.extraction import extract_tasks, load_model, lower_workload

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 7, 2, 3), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 1)).eval()
    x = torch.randn(1, 3, 28, 28)
    workload = load_model(model, [x])
    target = resolve_target("llvm")
    lowered = lower_workload(
        workload, target, replace(BF16_THROUGHOUT, bf16_image_windows=False, bf16_image_windows_avx512=False)
    )
    scripts = {task.name: task.mod.script() for task in extract_tasks(workload, target, lowered)}
    (first,) = [script for script in scripts.values() if '"bf16_dense"' in script]
    assert '"T_reshape"' not in first and '"compute"' in first  # ReLU's block, in the product's kernel
    assert not any('"T_reshape"' in script and '"T_add"' in script for script in scripts.values()), list(scripts)
    if bf16_unit(target) == AMX:
        (pointwise,) = [script for script in scripts.values() if '"bf16_conv2d"' in script]
        assert '"bf16_rows"' in pointwise and '"bf16_pad"' not in pointwise
    vm = relax.VirtualMachine(tvm.compile(lowered, target=target), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x.numpy()))
    got = (got[0] if isinstance(got, tvm.ir.Array) else got).numpy()
    with torch.no_grad():
        expected = model(x).numpy()
    assert np.max(np.abs(got - expected)) < 3e-2 * np.max(np.abs(expected))


def test_a_convolution_on_amx_over_channels_short_of_whole_steps_gets_zero_channels() -> None:
    # 48 channels: one step of 32 and a rest, which would load a second tile configuration per call;
    # padded to 64 (two steps), the activation's zero channels added by its pad, the result unchanged
    from tvm import relax

    from tuner.lowering.bf16.products import Bfloat16Products

    image = np.random.default_rng(1).standard_normal((1, 7, 7, 48)).astype(np.float32)
    weight = np.random.default_rng(2).standard_normal((3, 3, 48, 32)).astype(np.float32)
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(image.shape, "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            conv = relax.op.nn.conv2d(x, relax.const(weight), padding=1, data_layout="NHWC", kernel_layout="HWIO")
            out = builder.emit_output(builder.emit(conv))
        builder.emit_func_output(out)
    lowered = Bfloat16Products(unit=AMX)(builder.get())
    assert 'T.int64(2), T.int64(32), T.int64(16), T.int64(2)), "bfloat16")' in lowered.script()  # 64 channels
    run = relax.VirtualMachine(tvm.compile(lowered, target="llvm"), tvm.cpu())
    got = run["main"](tvm.runtime.tensor(image)).numpy()
    rounded = [a.astype(ml_dtypes.bfloat16) for a in (image, weight)]
    np.testing.assert_allclose(got, torch_conv_nhwc(*rounded, padding=1), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("unit", EACH_UNIT)
def test_a_product_of_two_activations_packs_its_second_operand_in_the_kernel(unit: str) -> None:
    from tuner.lowering.bf16.kernels import bf16_batch_matmul

    a = np.random.default_rng(1).standard_normal((2, 3, 20, 40)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((2, 3, 40, 30)).astype(np.float32)
    rows = padded_rows(20, 2, unit)
    a_t, b_t = te.placeholder(a.shape, "bfloat16", name="a"), te.placeholder(b.shape, "bfloat16", name="b")
    product = bf16_batch_matmul(a_t, b_t, rows, unit)
    module = te_module([a_t, b_t, product])
    as_bf16 = [x.astype(ml_dtypes.bfloat16) for x in (a, b)]
    expected = as_bf16[0].astype(np.float32) @ as_bf16[1].astype(np.float32)
    built = built_tiled(module, "bf16_dense", *tile_shapes(rows, 2, unit)[0], unit)
    np.testing.assert_allclose(run_built(built, as_bf16, (2, 3, 20, 30)), expected, rtol=1e-4, atol=1e-3)
    # the unscheduled kernel, which verification checks candidates against, computes the same
    reference = tvm.compile(module, target=resolve_target("llvm"))
    np.testing.assert_allclose(run_built(reference, as_bf16, (2, 3, 20, 30)), expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("unit", [AMX, AVX512])
@pytest.mark.parametrize(
    "groups, channels, outputs, stride, size, pad",
    [(3, 32, 32, 1, 24, 1), (2, 24, 24, 2, 48, 1), (4, 32, 16, 1, 20, 0)],
)
def test_a_grouped_convolution_of_wide_groups_is_one_of_ours(unit, groups, channels, outputs, stride, size, pad):
    # RegNet's shape: groups of many channels, the groups an axis of one product; 24 channels and outputs a group
    # get zero channels up to a whole step on AMX inside each group, and zero outputs up to 32; unpadded, the
    # product reads the activation itself
    from tvm import relax

    from tuner.lowering.bf16.products import Bfloat16Products

    image = np.random.default_rng(1).standard_normal((1, size, size, groups * channels)).astype(np.float32)
    weight = np.random.default_rng(2).standard_normal((3, 3, channels, groups * outputs)).astype(np.float32)
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(image.shape, "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            conv = relax.op.nn.conv2d(
                x,
                relax.const(weight),
                strides=stride,
                padding=pad,
                groups=groups,
                data_layout="NHWC",
                kernel_layout="HWIO",
            )
            out = builder.emit_output(builder.emit(conv))
        builder.emit_func_output(out)
    lowered = Bfloat16Products(unit=unit)(builder.get())
    text = lowered.script()
    assert "R.nn.conv2d" not in text and "R.split" not in text and text.count("def bf16_grouped_conv2d") == 1
    assert ("bf16_pad" in text) == (pad > 0 or stride > 1 or channels % 32 > 0)  # no copy it does not need
    image_bf16, weight_bf16 = (
        torch.from_numpy(a.astype(ml_dtypes.bfloat16).astype(np.float32)) for a in (image, weight)
    )
    expected = torch.nn.functional.conv2d(
        image_bf16.permute(0, 3, 1, 2), weight_bf16.permute(3, 2, 0, 1), stride=stride, padding=pad, groups=groups
    ).permute(0, 2, 3, 1)
    run = relax.VirtualMachine(tvm.compile(lowered, target="llvm"), tvm.cpu())
    got = run["main"](tvm.runtime.tensor(image)).numpy()
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-3)


@needs_amx
@pytest.mark.parametrize(
    "stride, window_call",
    [(1, "kernel_amx_r14_v2_p16_w3x3c16_z"), (2, "kernel_amx_r7_v2_p16_w3x3c16s2h8_z")],
)
def test_a_grouped_convolution_s_product_tiles_on_amx_and_gathers_its_groups_in_the_write_back(
    stride, window_call
) -> None:
    from tuner.lowering.bf16.kernels import bf16_grouped_conv2d_nhwc, pack_grouped_conv_weight

    groups, channels, size = 3, 32, 14
    out = size // stride
    image = bf16_array((1, size, size, groups * channels), 3)
    weight = np.random.default_rng(4).standard_normal((3, 3, channels, groups * channels)).astype(np.float32)
    packed = pack_grouped_conv_weight(weight, groups, 32)
    image_t = te.placeholder(image.shape, "bfloat16", name="image")
    kernel_t = te.placeholder(packed.shape, "bfloat16", name="kernel")
    conv = bf16_grouped_conv2d_nhwc(image_t, kernel_t, stride, (1, 1, 1, 1), channels, out, AMX)
    sch = tvm.s_tir.Schedule(te_module([image_t, kernel_t, conv]), seed=1)
    _tile(sch, sch.get_sblock("bf16_conv2d"), out, 2, AMX)
    assert 'sblock("bf16_groups")' not in sch.mod.script()  # no pass of its own over the output
    # one call sums each tile's window, its rows read from the phases laid out flat (16 rows per image row; at
    # stride 2 two phases of 8)
    assert window_call in sch.mod.script()
    assert register_if_ours(window_call.replace("kernel_", "tensor_tuner_"))  # a stored trace replays it elsewhere
    got = run_built(
        tvm.compile(sch.mod, target=resolve_target("llvm")),
        [image, packed.astype(ml_dtypes.bfloat16)],
        (1, out, out, groups * channels),
    )
    expected = torch.nn.functional.conv2d(
        torch.from_numpy(image.astype(np.float32)).permute(0, 3, 1, 2),
        torch.from_numpy(weight.astype(ml_dtypes.bfloat16).astype(np.float32)).permute(3, 2, 0, 1),
        stride=stride,
        padding=1,
        groups=groups,
    ).permute(0, 2, 3, 1)
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-3)


def test_a_convolution_of_narrow_or_small_groups_stays_relaxs_own() -> None:
    from tuner.lowering.bf16.products import wide_groups

    def grouped(groups: int, channels: int, size: int) -> bool:  # a 3x3 window, as many outputs as channels
        weight = np.zeros((3, 3, channels, groups * channels), np.float32)
        return wide_groups(groups, weight, (1, size, size, groups * channels), 1, (1, 1, 1, 1))

    assert grouped(2, 64, 56) and grouped(8, 64, 14) and grouped(17, 64, 7)  # RegNet's: 462, 116 and 61 MFLOP
    assert not grouped(1, 64, 56)  # not grouped: our convolution as it is
    assert not grouped(96, 1, 56)  # depthwise
    assert not grouped(4, 16, 7)  # 2.9 MFLOP: a launch of its own costs more than fp32 does
    assert not grouped(4, 8, 56)  # too narrow for our tiles
