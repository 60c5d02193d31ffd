"""A first convolution reading its padded image in place: each activation tile's rows overlap (a
stride's pixels apart, each reading a window row's values from there: AMX's step of 32, or KW*C up to
a pair on ``vdpbf16ps``), one micro-kernel call sums the window's rows; against PyTorch's convolution
of the same bf16 values, scheduled and as the lowering makes it, on each unit."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
import torch
import tvm
from bf16_builds import EACH_UNIT, bf16_array, needs_bf16, run_built, te_module, torch_conv_nhwc, tuned_in_bf16
from tvm import relax, te

from codegen.bf16_dot import AMX, AVX512, register_if_ours
from tuner.lowering.bf16.flat import (
    bf16_conv2d_image_windows,
    bf16_padded_image,
    image_windows_extent,
    pack_window_rows_weight,
    window_run,
)
from tuner.lowering.bf16.kernels import out_extent
from tuner.lowering.bf16.products import Bfloat16Products
from tuner.spaces.bf16_rule import _tile, padded_rows, tile_shapes
from tuner.spaces.copy_rule import schedule_bf16_copy
from tuner.targets import resolve_target

# ResNet's 7x7 at stride 2, SqueezeNet's and MobileNetV2's 3x3 at stride 2, ConvNeXt's 4x4 at stride 4
CONVOLUTIONS = [(23, 7, 2, 3, 64), (21, 3, 2, 0, 64), (20, 3, 2, 1, 32), (24, 4, 4, 0, 96)]


@pytest.mark.parametrize("unit", EACH_UNIT)
@pytest.mark.parametrize(("size", "kernel", "stride", "pad", "outputs"), CONVOLUTIONS)
def test_the_scheduled_product_over_the_image_in_place_is_the_convolution(unit, size, kernel, stride, pad, outputs):
    image, weight = bf16_array((1, size, size, 3), 1), bf16_array((kernel, kernel, 3, outputs), 2)
    run = window_run(kernel, 3, unit)
    packed = pack_window_rows_weight(weight, run)
    out_h, out_w = (out_extent(size, pad, pad, kernel, stride),) * 2
    columns = padded_rows(out_w, packed.shape[2], unit)
    rows, pixels = image_windows_extent((size, size), (kernel, kernel), stride, (pad,) * 4, columns, 3, run)
    padded = np.zeros((1, rows, pixels, 3), ml_dtypes.bfloat16)
    padded[:, pad : pad + size, pad : pad + size] = image
    flat_t = te.placeholder((1, rows * pixels * 3), "bfloat16", name="flat")
    kernel_t = te.placeholder(packed.shape, "bfloat16", name="kernel")
    conv = bf16_conv2d_image_windows(flat_t, kernel_t, (out_h, columns, pixels, 3), stride, unit, 1.0)
    sch = tvm.s_tir.Schedule(te_module([flat_t, kernel_t, conv]), seed=1)
    _tile(sch, sch.get_sblock("bf16_conv2d"), *tile_shapes(columns, packed.shape[2], unit)[0], unit)
    script = sch.mod.script()
    # one call per tile over the window's rows, its activation rows a stride's pixels (3 values each) apart,
    # on AMX its accumulators starting from zero tiles (the call is the tile's whole reduction)
    window = f"p{run // 2}_w{kernel}x1c{pixels // stride}o{3 * stride}" + ("_z" if unit == AMX else "")
    (name,) = set(re.findall(rf"tensor_tuner_kernel_({unit}_r\d+_v\d+_{window})\b", script))
    assert register_if_ours(f"tensor_tuner_{name}")  # a stored trace naming it replays in another process
    built = tvm.compile(sch.mod, target=resolve_target("llvm"))
    got = run_built(built, [padded.reshape(1, -1), packed], tuple(int(d) for d in conv.shape))
    expected = torch_conv_nhwc(image, weight, stride, pad)
    np.testing.assert_allclose(got[:, :, :out_w], expected, rtol=1e-4, atol=1e-3)


def _first_convolution(image_nchw: np.ndarray, weight: np.ndarray, stride: int, pad: int) -> tvm.IRModule:
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(image_nchw.shape, "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            data = builder.emit(relax.op.permute_dims(x, [0, 2, 3, 1]))
            conv = relax.op.nn.conv2d(
                data, relax.const(weight), strides=stride, padding=pad, data_layout="NHWC", kernel_layout="HWIO"
            )
            out = builder.emit_output(builder.emit(conv))
        builder.emit_func_output(out)
    return builder.get()


@pytest.mark.parametrize("unit", [AVX512, AMX])
@pytest.mark.parametrize("image_windows", [True, False])
def test_the_lowering_reads_a_model_s_input_in_place_and_computes_its_convolution(unit, image_windows) -> None:
    # built with TVM's default schedules: what the lowering computes, on any CPU
    size, kernel, stride, pad, outputs = CONVOLUTIONS[0]
    image = np.random.default_rng(1).standard_normal((1, 3, size, size)).astype(np.float32)
    weight = np.random.default_rng(2).standard_normal((kernel, kernel, 3, outputs)).astype(np.float32)
    lowered = Bfloat16Products(unit, image_windows)(_first_convolution(image, weight, stride, pad))
    lowered = relax.transform.DeadCodeElimination(["main"])(lowered)
    script = lowered.script()
    assert ("bf16_patches" in script) != image_windows and "bf16_padded_image" in script
    run = relax.VirtualMachine(tvm.compile(lowered, target="llvm"), tvm.cpu())
    got = run["main"](tvm.runtime.tensor(image)).numpy()
    rounded = [a.astype(ml_dtypes.bfloat16) for a in (image.transpose(0, 2, 3, 1), weight)]
    np.testing.assert_allclose(got, torch_conv_nhwc(*rounded, stride, pad), rtol=1e-4, atol=1e-3)


def test_a_window_row_longer_than_an_amx_step_keeps_its_patches() -> None:
    assert window_run(7, 3, AMX) == 32 and window_run(4, 8, AMX) == 32 and window_run(11, 3, AMX) is None
    assert window_run(7, 3, AVX512) == 22 and window_run(11, 3, AVX512) == 34
    image = np.zeros((1, 3, 32, 32), np.float32)
    lowered = Bfloat16Products(AMX)(_first_convolution(image, np.ones((11, 11, 3, 16), np.float32), 4, 2))
    assert "bf16_patches" in lowered.script()


@pytest.mark.parametrize(
    ("padding", "extent"), [((1, 1, 1, 1), (12, 20)), ((3, 3, 3, 3), (16, 18)), ((0, 0, 1, 1), (11, 11))]
)
def test_the_padded_image_copies_the_image_s_own_pixels_apart_from_its_padding(padding, extent) -> None:
    """``tuner.spaces.copy_rule`` cuts each row's pixels at the image's edges, so that the image's own convert without
    a test per value; the copy is the image transposed, cast and zero-padded, and the schedule replays from
    its trace as a database stores it."""
    data = te.placeholder((1, 3, 10, 10), "float32", name="data")
    module = te_module([data, bf16_padded_image(data, padding, extent)])
    sch = tvm.s_tir.Schedule(module)
    (scheduled,) = schedule_bf16_copy(sch, sch.get_sblock("bf16_padded_image"))
    parts = [p for p in (padding[1], 10, extent[1] - padding[1] - 10) if p > 0]
    assert scheduled.mod.script().count("for pixel") == len(parts)
    replayed = tvm.s_tir.Schedule(module)
    tvm.s_tir.schedule.Trace.apply_json_to_schedule(scheduled.trace.as_json(), replayed)
    tvm.ir.assert_structural_equal(replayed.mod, scheduled.mod)

    image = np.random.default_rng(0).standard_normal((1, 3, 10, 10)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((1, *extent, 3), ml_dtypes.bfloat16))
    tvm.compile(scheduled.mod, target="llvm")["main"](tvm.runtime.tensor(image), out)
    top, left = padding[:2]
    expected = np.zeros((1, *extent, 3), np.float32)
    expected[0, top : top + 10, left : left + 10] = image[0].transpose(1, 2, 0).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out.numpy().astype(np.float32), expected)


@needs_bf16
@pytest.mark.slow  # 25 s; the product over the image in place is checked above: out of CI (`pytest -m slow`)
def test_a_stem_tuned_in_bf16_searches_its_first_convolution_in_place_and_matches_pytorch(tmp_path) -> None:

    torch.manual_seed(0)
    stem = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 7, 2, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1)).eval()
    x = torch.randn(1, 3, 40, 40)
    result = tuned_in_bf16(stem, x, 4, tmp_path / "wd")
    (first,) = [t for t in result.tasks if "bf16_conv2d" in t.name]
    # verified, unless the in-model choice gave it back its analytic schedule (checked end to end)
    taken_back = first.tuned_in_model_latency is not None
    assert first.trials and (first.verified or taken_back) and not first.fell_back, result.summary()
    assert not any("patches" in t.name for t in result.tasks), result.summary()
    with torch.no_grad():
        expected = stem(x).numpy()
    got = np.asarray(result.run(x.numpy()))
    assert np.max(np.abs(got - expected)) <= 3e-2 * np.max(np.abs(expected))
