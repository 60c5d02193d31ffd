"""bfloat16 on CPUs: the vdpbf16ps micro-kernels against numpy, the design space of a bf16 GEMM
built and checked, a small model tuned end to end in bf16, and what a target without the
instruction gets (a warning, or a refusal before anything starts)."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
import torch
import tvm
from bf16_builds import (
    bf16_array,
    built_tiled,
    dense_module,
    needs_amx,
    needs_bf16,
    run_built,
    te_module,
    torch_conv_nhwc,
    tuned_in_bf16,
)
from tvm import te

import tuner
from codegen.amx_dot import fits
from codegen.bf16_dot import AMX, AVX512, PAIR
from tuner.errors import TargetError
from tuner.lowering.bf16.kernels import bf16_conv2d_nhwc, bf16_dense, pack_conv_weight, pack_dense_weight
from tuner.lowering.bf16.precision import check_bf16
from tuner.spaces.bf16_rule import padded_rows, tile_shapes
from tuner.targets import has_bf16_dot_product


@needs_bf16
@pytest.mark.parametrize(("rows", "vectors"), [(1, 1), (1, 2), (3, 1), (4, 2)])
def test_micro_kernels_compute_the_bf16_product_numpy_computes(rows: int, vectors: int) -> None:
    m, n, k = 12, 64, 34
    built = built_tiled(dense_module(m, n, k), "gemm", rows, vectors)
    assert "vdpbf16ps" in built.mod.inspect_source("asm")
    data, weight = bf16_array((m, k), 1), bf16_array((k, n), 2)
    expected = data.astype(np.float32) @ weight.astype(np.float32)
    out = run_built(built, [data, pack_dense_weight(weight)], (m, n))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


@needs_amx
@pytest.mark.parametrize(
    ("m", "k", "rows", "vectors"),
    [(32, 64, 32, 2), (32, 40, 16, 3), (14, 34, 14, 3), (28, 96, 28, 1), (6, 6, 3, 2)],
)
def test_amx_micro_kernels_compute_the_bf16_product_numpy_computes(m: int, k: int, rows: int, vectors: int) -> None:
    # reductions of whole 32-wide steps, steps and a rest (40, 34, 96 = 3 steps) and a rest alone (6);
    # tiles of two activation tiles (28 = 16 + 12 rows) and of one
    n = 96
    built = built_tiled(dense_module(m, n, k), "gemm", rows, vectors, AMX)
    # each call is its tile's whole reduction: its accumulators start as zero tiles, not loaded from C
    assert "tdpbf16ps" in built.mod.inspect_source("asm") and "tilezero" in built.mod.inspect_source("asm")
    data, weight = bf16_array((m, k), 1), bf16_array((k, n), 2)
    expected = data.astype(np.float32) @ weight.astype(np.float32)
    out = run_built(built, [data, pack_dense_weight(weight)], (m, n))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


@needs_amx
def test_amx_tiles_can_still_start_from_c_and_compute_the_same_product() -> None:
    # experiments/amx_zero_tiles.py compares the two starts on one schedule
    from tuner.spaces.bf16_rule import _tile
    from tuner.targets import resolve_target

    m, n, k = 64, 64, 96
    sch = tvm.s_tir.Schedule(dense_module(m, n, k), seed=1)
    _tile(sch, sch.get_sblock("gemm"), 32, 2, AMX, zero_tiles=False)
    built = tvm.compile(sch.mod, target=resolve_target("llvm"))
    assert "tilezero" not in built.mod.inspect_source("asm")
    data, weight = bf16_array((m, k), 1), bf16_array((k, n), 2)
    out = run_built(built, [data, pack_dense_weight(weight)], (m, n))
    np.testing.assert_allclose(out, data.astype(np.float32) @ weight.astype(np.float32), rtol=1e-5, atol=1e-4)


def test_an_amx_tile_starting_from_zero_tiles_stores_no_zeros_before_its_call() -> None:
    """A call that is its tile's whole reduction starts from zero tiles and reads nothing of C: the zeros its
    initialisation stored there (4 KB a 32x32 tile, every tile) were never read, 16% of a 64-deep product's
    time. Where the accumulators start from C (or carry a chunked reduction's sums), its zeros are stored."""
    from codegen.bf16_dot import register_if_ours
    from tuner.spaces.bf16_rule import _tile

    def initialisation(zero_tiles: bool) -> str:
        sch = tvm.s_tir.Schedule(dense_module(64, 64, 96), seed=1)
        _tile(sch, sch.get_sblock("gemm"), 32, 2, AMX, zero_tiles=zero_tiles)
        script = sch.mod.script()
        return script[script.index('T.sblock("gemm_init') : script.index('T.sblock("gemm_update')]

    assert "= T.float32(0.0)" not in initialisation(True) and "T.evaluate(0)" in initialisation(True)
    assert "= T.float32(0.0)" in initialisation(False)
    assert register_if_ours("tensor_tuner_amx_zeroed_r32_v2")  # a stored trace naming it replays elsewhere


def _amx_space_intrinsics(mod: tvm.IRModule, block: str) -> list[set[str]]:
    from tuner.spaces.bf16_rule import UNIT_ANNOTATION, schedule_bf16_gemm

    sch = tvm.s_tir.Schedule(mod, seed=1)
    sch.unannotate(sch.get_sblock(block), UNIT_ANNOTATION)
    sch.annotate(sch.get_sblock(block), UNIT_ANNOTATION, AMX)
    return [
        set(re.findall(r"tensor_tuner_amx_r\w+", str(space.trace)))  # the micro-kernels, not the zeroed tiles
        for space in schedule_bf16_gemm(sch, sch.get_sblock(block))
    ]


def _conv_module(channels: int, window: int) -> tvm.IRModule:
    image_t = te.placeholder((1, 4, 32, channels), "bfloat16", name="image")
    kernel_t = te.placeholder(pack_conv_weight(bf16_array((window, window, channels, 32), 1)).shape, "bfloat16")
    pad = window // 2
    return te_module([image_t, kernel_t, bf16_conv2d_nhwc(image_t, kernel_t, 1, (pad, pad, pad, pad), 32, AMX)])


def test_amx_design_spaces_take_a_long_reduction_whole_and_in_chunks_where_a_call_is_one_tap() -> None:
    from tuner.spaces.bf16_rule import AMX_REDUCTION_CHUNK

    k = 3 * AMX_REDUCTION_CHUNK * PAIR
    for mod, block in [(dense_module(64, 32, k), "gemm"), (_conv_module(k, 1), "bf16_conv2d")]:
        spaces = _amx_space_intrinsics(mod, block)
        assert any(f"_p{3 * AMX_REDUCTION_CHUNK}" in name for names in spaces for name in names)
        assert any(name.endswith(f"_p{AMX_REDUCTION_CHUNK}") for names in spaces for name in names)
    # a reduction of one chunk (the same call), or a 3x3 window's, is taken whole
    chunk = AMX_REDUCTION_CHUNK
    for mod, block, pairs in [
        (dense_module(64, 32, chunk * PAIR), "gemm", chunk),
        (_conv_module(k, 3), "bf16_conv2d", k // PAIR),
    ]:
        names = set().union(*_amx_space_intrinsics(mod, block))
        assert names and all(f"_p{pairs}" in name for name in names)


@needs_amx
def test_amx_tiles_taking_the_reduction_in_chunks_compute_the_same_product() -> None:
    # the accumulators of a task's tiles go through memory between chunks; the first chunk starts from C's zeros
    from tuner.spaces.bf16_rule import AMX_REDUCTION_CHUNK, _tile
    from tuner.targets import resolve_target

    m, n, k = 96, 64, 3 * AMX_REDUCTION_CHUNK * PAIR
    sch = tvm.s_tir.Schedule(dense_module(m, n, k), seed=1)
    _tile(sch, sch.get_sblock("gemm"), 32, 2, AMX, chunks=True)
    assert f"_p{AMX_REDUCTION_CHUNK}" in str(sch.trace)  # the intrinsic of a chunk's pairs
    built = tvm.compile(sch.mod, target=resolve_target("llvm"))
    assert "tilezero" not in built.mod.inspect_source("asm")
    data, weight = bf16_array((m, k), 1), bf16_array((k, n), 2)
    out = run_built(built, [data, pack_dense_weight(weight)], (m, n))
    np.testing.assert_allclose(out, data.astype(np.float32) @ weight.astype(np.float32), rtol=1e-5, atol=2e-4)
    # a 1x1 convolution's window of one tap: chunked the same way
    sch = tvm.s_tir.Schedule(_conv_module(k, 1), seed=1)
    _tile(sch, sch.get_sblock("bf16_conv2d"), 32, 2, AMX, chunks=True)
    image, kernel = bf16_array((1, 4, 32, k), 3), bf16_array((1, 1, k, 32), 1)  # _conv_module's shapes
    got = run_built(
        tvm.compile(sch.mod, target=resolve_target("llvm")), [image, pack_conv_weight(kernel)], (1, 4, 32, 32)
    )
    expected = image.astype(np.float32) @ kernel[0, 0].astype(np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-4)


@needs_amx
def test_amx_micro_kernels_of_other_tile_shapes_called_in_turn_each_load_their_own_configuration() -> None:
    # a micro-kernel loads its tile configuration only when the thread holds another: kernels of two
    # shapes called in turn on the same threads must each find theirs replaced and load it again
    m, n = 32, 96
    cases = [(64, 32, 2), (40, 16, 3)]
    built = [built_tiled(dense_module(m, n, k), "gemm", rows, vectors, AMX) for k, rows, vectors in cases]
    operands = [(bf16_array((m, k), k), bf16_array((k, n), k + 1)) for k, _, _ in cases]
    for _ in range(2):
        for module, (data, weight) in zip(built, operands, strict=True):
            expected = data.astype(np.float32) @ weight.astype(np.float32)
            out = run_built(module, [data, pack_dense_weight(weight)], (m, n))
            np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


def test_amx_tiles_fit_its_eight_tile_registers_and_prefer_four_full_blocks() -> None:
    assert fits(32, 2) and fits(16, 3) and fits(48 // 2, 2) and not fits(32, 3) and not fits(48, 2)
    assert tile_shapes(64, 4, AMX)[0] == (32, 2)
    assert tile_shapes(56, 6, AMX)[0] == (28, 2)  # 56 image columns: two tiles of 14 rows
    assert tile_shapes(7, 6, AMX)[0] == (7, 3)
    assert padded_rows(197, 48, AMX) == 203  # 7 tiles of 29 rows (16 + 13), not 197 of one
    assert padded_rows(56, 4, AMX) == 56


def test_packed_layouts_put_pairs_along_the_reduction_and_sixteen_outputs_together() -> None:
    weight = np.arange(4 * 32, dtype=np.float32).reshape(4, 32)  # [K, N]
    packed = pack_dense_weight(weight)
    assert packed.shape == (2, 2, 16, 2)
    assert packed[1, 1, 3, 0] == weight[2, 16 + 3] and packed[1, 1, 3, 1] == weight[3, 16 + 3]
    conv = np.arange(3 * 3 * 4 * 16, dtype=np.float32).reshape(3, 3, 4, 16)  # HWIO
    assert pack_conv_weight(conv)[2, 1, 0, 1, 5, 1] == conv[2, 1, 3, 5]


def test_tile_shapes_keep_the_accumulators_in_registers() -> None:
    shapes = tile_shapes(rows=56, channel_blocks=4)
    assert shapes[0] == (4, 4) and all(r * v <= 24 for r, v in shapes)
    assert tile_shapes(rows=42, channel_blocks=12)[0] == (6, 4)


def test_rows_without_a_good_divisor_get_a_few_zero_rows_and_the_rest_none() -> None:
    assert padded_rows(197, channel_blocks=24) == 198  # ViT's tokens: 6x4 tiles instead of 1x4
    assert padded_rows(13, channel_blocks=63) == 14  # SqueezeNet's last columns: 7x3 instead of 1x3
    for rows in (1, 7, 27, 55, 56, 111, 128, 1500):  # 27 and 111 columns: 3x4 tiles, fast enough
        assert padded_rows(rows, channel_blocks=24) == rows


@needs_bf16
def test_a_product_computed_over_zero_rows_gives_the_product_in_its_own_rows() -> None:
    tokens, k, n = 13, 34, 32
    data, weight = bf16_array((tokens, k), 1), bf16_array((k, n), 2)
    packed = pack_dense_weight(weight)
    data_t = te.placeholder(data.shape, "bfloat16", name="data")
    packed_t = te.placeholder(packed.shape, "bfloat16", name="packed")
    dense = built_tiled(te_module([data_t, packed_t, bf16_dense(data_t, packed_t, rows=14)]), "bf16_dense", 7, 2)
    out = run_built(dense, [data, packed], (14, n))
    np.testing.assert_allclose(out[:tokens], data.astype(np.float32) @ weight.astype(np.float32), rtol=1e-5, atol=1e-4)
    assert not out[tokens:].any()
    image, kernel = bf16_array((1, 5, 13, 6), 3), bf16_array((3, 3, 6, 16), 4)
    image_t = te.placeholder(image.shape, "bfloat16", name="image")
    kernel_t = te.placeholder(pack_conv_weight(kernel).shape, "bfloat16", name="kernel")
    conv = bf16_conv2d_nhwc(image_t, kernel_t, 1, (1, 1, 1, 1), columns=14)
    built = built_tiled(te_module([image_t, kernel_t, conv]), "bf16_conv2d", 7, 1)
    got = run_built(built, [image, pack_conv_weight(kernel)], (1, 5, 14, 16))
    expected = torch_conv_nhwc(image, kernel, padding=1)
    np.testing.assert_allclose(got[:, :, :13], expected, rtol=1e-4, atol=1e-3)


def test_a_linear_layer_over_197_tokens_is_computed_over_198_and_sliced_back() -> None:
    from tvm import relax

    from tuner.lowering.bf16.products import Bfloat16Products

    weight = np.random.default_rng(2).standard_normal((64, 40)).astype(np.float32)
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 197, 64), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(builder.emit(relax.op.matmul(x, relax.const(weight))))
        builder.emit_func_output(out)
    lowered = Bfloat16Products(unit=AVX512)(builder.get())
    text = lowered.script()
    assert "(1, 198, 48)" in text and "R.strided_slice" in text, text
    data = np.random.default_rng(1).standard_normal((1, 197, 64)).astype(np.float32)
    run = relax.VirtualMachine(tvm.compile(lowered, target="llvm"), tvm.cpu())
    got = run["main"](tvm.runtime.tensor(data)).numpy()
    expected = data.astype(ml_dtypes.bfloat16).astype(np.float32) @ weight.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert got.shape == (1, 197, 40)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)


@needs_bf16
def test_the_work_after_a_slice_of_padded_rows_and_outputs_is_done_tile_by_tile_in_the_products_loop() -> None:
    # 13 tokens computed over 14 rows and 40 outputs over 48: the copy dropping the rows, the slice dropping
    # the outputs, the bias and the activation after them were each a parallel pass of their own, then one
    # pass reading the whole fp32 product back
    from tuner.spaces.bf16_rule import _tile
    from tuner.targets import resolve_target

    tokens, k, n = 13, 34, 40
    data, weight = bf16_array((tokens, k), 1), bf16_array((k, n), 2)
    bias = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    packed = pack_dense_weight(weight)
    data_t = te.placeholder(data.shape, "bfloat16", name="data")
    packed_t = te.placeholder(packed.shape, "bfloat16", name="packed")
    bias_t = te.placeholder((n,), "float32", name="bias")
    product = bf16_dense(data_t, packed_t, rows=14)
    rows = te.compute((tokens, packed.shape[0] * 16), lambda i, j: product[i, j], name="rows")
    sliced = te.compute((tokens, n), lambda i, j: rows[i, j], name="sliced")
    biased = te.compute((tokens, n), lambda i, j: sliced[i, j] + bias_t[j], name="biased")
    relu = te.compute((tokens, n), lambda i, j: te.max(biased[i, j], tvm.tirx.const(0, "float32")), name="relu")
    sch = tvm.s_tir.Schedule(te_module([data_t, packed_t, bias_t, relu]), seed=1)
    _tile(sch, sch.get_sblock("bf16_dense"), 7, 1)
    text = sch.mod.script()
    after = re.findall(r'T.sblock\("(\w+)"\)', text.split("bf16_dense_update")[-1])
    assert len(after) == 1 and text.count("T.parallel(") == 2, text  # the rows' pad, the product and its epilogue
    got = run_built(tvm.compile(sch.mod, target=resolve_target("llvm")), [data, packed, bias], (tokens, n))
    expected = np.maximum(data.astype(np.float32) @ weight.astype(np.float32) + bias, 0)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


class _SmallNet(torch.nn.Module):
    """Every kind of bf16 kernel: a padded convolution of 3 channels (a zero channel added) into 24
    (8 zero outputs added, and on 13 image columns a 14th: both sliced off), a depthwise one (bf16
    storage, fp32 arithmetic), a strided one, a 1x1 one with a residual, and a linear layer of 10 outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 24, 3, padding=1)
        self.depthwise = torch.nn.Conv2d(24, 24, 3, padding=1, groups=24)
        self.conv2 = torch.nn.Conv2d(24, 64, 3, stride=2, padding=1)
        self.conv3 = torch.nn.Conv2d(64, 64, 1)
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.depthwise(torch.relu(self.conv1(x))))
        x = torch.relu(self.conv2(x))
        x = self.conv3(x) + x
        return self.fc(x.mean((2, 3)))


@needs_bf16
def test_a_model_tuned_in_bf16_uses_the_dot_product_verifies_and_matches_pytorch(tmp_path) -> None:
    torch.manual_seed(0)
    model, x = _SmallNet().eval(), torch.randn(1, 3, 13, 13)  # 13 columns: computed over 14
    result = tuned_in_bf16(model, x, 3, tmp_path / "wd")
    # its four products (on AMX its two first convolutions, of 3 and 24 channels, are products over patches)
    bf16_kernels = [t for t in result.tasks if "bf16_conv2d" in t.name or "bf16_dense" in t.name]
    assert len(bf16_kernels) == 4, result.summary()
    searched = [t for t in bf16_kernels if t.trials]  # the budget goes where it pays: not to every kernel
    # each one's tuned record verified, unless the in-model choice gave it back its analytic schedule (which ran
    # faster inside the model: a matter of timing on kernels of a few microseconds), checked end to end below
    taken_back = [t for t in searched if t.tuned_in_model_latency is not None]
    assert len(searched) >= 2 and not any(t.fell_back for t in searched), result.summary()
    assert all(t.verified for t in searched if t not in taken_back), result.summary()
    assert result.check.ok and result.check.error < 3e-2, result.summary()
    with torch.no_grad():
        expected = model(x).numpy()
    got = result.run(x.numpy())
    got = got[0] if isinstance(got, list | tuple) else got
    assert np.max(np.abs(np.asarray(got) - expected)) <= 3e-2 * np.max(np.abs(expected))


@needs_bf16
@pytest.mark.slow  # 20 s more than the tuning above, which stays in CI: out of it (`pytest -m slow`)
def test_a_bf16_work_dir_is_applied_in_bf16_though_the_call_names_no_dtype(tmp_path, capfd) -> None:
    from tuner.compile.apply import apply

    torch.manual_seed(0)
    model, x = _SmallNet().eval(), torch.randn(1, 3, 13, 13)
    tuned_in_bf16(model, x, 1, tmp_path / "wd")
    with torch.no_grad():
        expected = model(x).numpy()
    capfd.readouterr()
    # applied as the work dir was tuned (bf16), with bf16's tolerance
    apply(tmp_path / "wd", model, tmp_path / "applied.so", example_inputs=[x])
    said = capfd.readouterr().err
    assert "matches TVM's default schedules" in said and "against PyTorch in fp32" in said, said
    applied = tuner.load(tmp_path / "applied.so")(x.numpy())
    assert np.max(np.abs(np.asarray(applied) - expected)) <= 3e-2 * np.max(np.abs(expected))


def test_a_cpu_that_cannot_compute_in_bf16_is_refused_when_named_and_warned_about_when_it_is_this_one() -> None:
    rocket_lake = tvm.target.Target({"kind": "llvm", "mcpu": "rocketlake"})
    assert not has_bf16_dot_product(rocket_lake)
    with pytest.raises(TargetError, match="-mcpu=rocketlake does not have"):
        check_bf16("llvm -mcpu=rocketlake", rocket_lake)
    assert "computes as float32 here" in check_bf16("llvm", rocket_lake)
    assert check_bf16("llvm", tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})) is None
    with pytest.raises(TargetError, match="sm_80 or later"):
        check_bf16("cuda -arch=sm_75", tvm.target.Target({"kind": "cuda", "arch": "sm_75"}))


def test_tune_refuses_bf16_on_a_named_cpu_without_it_before_anything_starts(tmp_path) -> None:
    with pytest.raises(TargetError, match="needs AVX512_BF16"):
        tuner.tune(
            _SmallNet().eval(),
            example_inputs=[torch.randn(1, 3, 16, 16)],
            target="llvm -mcpu=skylake-avx512",
            dtype="bfloat16",
            trials=4,
            work_dir=tmp_path / "wd",
        )
    assert not (tmp_path / "wd" / "tuning.db").exists()


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(64, 192), torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.reshape(1, 40, 2, 32).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        scores = (q @ k.transpose(-1, -2) / 32**0.5).softmax(-1)
        return self.out((scores @ v).transpose(1, 2).reshape(1, 40, 64))


@needs_bf16
@pytest.mark.slow  # 100 s on AMX; its lowering is tested above, a bf16 model tuned: out of CI (`pytest -m slow`)
def test_attention_tuned_in_bf16_computes_its_products_of_activations_in_bf16(tmp_path) -> None:
    torch.manual_seed(0)
    model, x = _Attention().eval(), torch.randn(1, 40, 64)  # 40 tokens: on AMX a reduction of a whole step
    result = tuned_in_bf16(model, x, 8, tmp_path / "wd")
    products = [t for t in result.tasks if "bf16_batch_matmul" in t.name]
    assert len(products) == 2 and not any(t.fell_back for t in products), result.summary()
    assert result.check.ok and result.check.error < 3e-2, result.summary()
    with torch.no_grad():
        expected = model(x).numpy()
    got = np.asarray(result.run(x.numpy()))
    assert np.max(np.abs(got - expected)) <= 3e-2 * np.max(np.abs(expected))


def test_an_activation_read_by_products_and_by_a_sum_is_cast_once_and_the_sum_reads_the_bf16_copy() -> None:
    from tvm import relax

    from tuner.lowering.bf16.products import Bfloat16Products

    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 8, 32), "float32"))
    weight = relax.const(np.ones((1, 1, 32, 32), np.float32))
    with builder.function("main", [x]):
        with builder.dataflow():
            first = builder.emit(relax.op.nn.conv2d(x, weight, data_layout="NHWC", kernel_layout="HWIO"))
            second = builder.emit(relax.op.nn.conv2d(x, weight, data_layout="NHWC", kernel_layout="HWIO"))
            out = builder.emit_output(builder.emit(relax.op.add(relax.op.add(first, second), x)))
        builder.emit_func_output(out)
    text = Bfloat16Products(unit=AVX512)(builder.get()).script()
    assert text.count('R.astype(x, dtype="bfloat16")') == 1, text  # one cast for both products
    casts = [line for line in text.splitlines() if "R.astype(" in line and line.endswith('dtype="bfloat16")')]
    assert len(casts) == 1, text  # the second product does not cast x's fp32 copy back
    assert text.count('dtype="float32")') >= 1 and "R.add(lv" in text, text
    widened = [line for line in text.splitlines() if "R.astype(" in line and 'dtype="float32"' in line]
    assert len(widened) == 1, text  # the sum reads x back from its bf16 copy
