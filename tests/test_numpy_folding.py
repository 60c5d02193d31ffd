"""Constant steps folded in NumPy (tuner.lowering.numpy_folding): the same constants, bit for bit, as
TVM's FoldConstant makes by compiling and running each step, and what is not NumPy's left to it."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tuner.lowering.numpy_folding import FoldConstantsInNumpy


def _batch_norm_folding_module(epsilon: relax.Expr) -> tvm.IRModule:
    """A convolution weight scaled as FoldBatchnormToConv2D leaves it: gamma / sqrt(var + eps), each step
    a call of constants; plus a permute to HWIO, a reshape and an exp (not NumPy's)."""
    rng = np.random.default_rng(0)
    weight = relax.const(rng.standard_normal((8, 4, 3, 3)).astype("float32"))
    gamma, var = (relax.const(rng.uniform(0.5, 2.0, (8,)).astype("float32")) for _ in range(2))
    mean, beta = (relax.const(rng.standard_normal((8,)).astype("float32")) for _ in range(2))
    x = relax.Var("x", relax.TensorType((8, 1, 1, 1), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            scale = bb.emit(relax.op.divide(gamma, relax.op.sqrt(relax.op.add(var, epsilon))))
            scaled = bb.emit(relax.op.multiply(weight, relax.op.reshape(scale, (8, 1, 1, 1))))
            shift = bb.emit(relax.op.subtract(beta, relax.op.multiply(mean, scale)))
            hwio = bb.emit(relax.op.permute_dims(scaled, [2, 3, 1, 0]))
            grown = bb.emit(relax.op.exp(relax.op.expand_dims(shift, axis=[0])))
            out = bb.emit_output(relax.Tuple([hwio, grown, relax.op.add(x, relax.op.reshape(shift, (8, 1, 1, 1)))]))
        bb.emit_func_output(out)
    return bb.get()


def _outputs(mod: tvm.IRModule) -> list:
    """What each field of the function's output tuple is bound to (after folding: a constant or a call)."""
    func = mod["main"]
    bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}

    def resolve(expr):
        while isinstance(expr, relax.Var) and expr in bound:
            expr = bound[expr]
        return expr

    return [resolve(field) for field in resolve(func.body.body).fields]


# the epsilon as a constant tensor, or as the literal PyTorch's importer writes for a batch norm's (Hugging Face's
# ResNet-50: its 53 norms' 424 steps left to FoldConstant took 14.8 of a 16.8 s lowering)
@pytest.mark.parametrize("epsilon", [relax.const(1e-5, "float32"), tvm.tirx.FloatImm("float32", 1e-5)])
def test_numpy_folds_the_steps_fold_constant_would_build_and_gets_the_same_bits(epsilon):
    mod = _batch_norm_folding_module(epsilon)
    by_tvm = relax.transform.FoldConstant()(mod)
    by_numpy = FoldConstantsInNumpy()(mod)
    script = by_numpy["main"].script()
    for step in ("R.divide", "R.sqrt", "R.multiply", "R.subtract", "R.permute_dims"):
        assert step not in script, step
    assert "R.exp" in script  # not NumPy's: left to FoldConstant
    finished = relax.transform.FoldConstant()(by_numpy)
    ours, theirs = _outputs(finished), _outputs(by_tvm)
    for a, b in zip(ours[:2], theirs[:2], strict=True):  # the weight in HWIO, exp of the shift
        assert isinstance(a, tvm.ir.expr.Constant) and isinstance(b, tvm.ir.expr.Constant)
        a, b = a.value.numpy(), b.value.numpy()
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
