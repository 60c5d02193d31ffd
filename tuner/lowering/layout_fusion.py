"""Layout-only kernels pulled into the matmuls and reductions that consume them.

FuseOps fuses element-wise epilogues into a matmul or convolution, but never a producer into one:
the reshape/transpose/slice chains between the projections and the attention matmuls of a
transformer each become a kernel of their own, which reads and writes the whole tensor and costs a
launch (ten of the 21 kernels of a small attention block). Pulled into their consumer, they become
index arithmetic on its reads (MetaSchedule's AutoInline inlines them), and the launches go away.

Runs on FuseOps' output, before FuseTIR: each merged kernel is a new Primitive function holding the
producer's and the consumer's ``call_tir``s, which FuseTIR then turns into one PrimFunc. A producer
used by several consumers is copied into each (it only moves data); a producer left unused is dead
code for DeadCodeElimination.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relax
from tvm.ir.expr import Constant
from tvm.ir.module import IRModule

from tuner.spaces.metaschedule import prim_func_flops

_INJECTIVE = 2  # op patterns (tvm/relax/op_attr_types.h): element-wise 0, broadcast 1, injective 2
_BROADCAST = 1
_REDUCING = (3, 4)  # a reduction; a matmul or convolution (out-element-wise fusable)
# operations per element a consumer may recompute at each of its reads (a residual add, a scaling):
# more, and recomputing costs more than the kernel launch it saves
_MAX_ARITHMETIC = 1.0
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
_MATH_CALLS = set(
    (
        "exp exp2 exp10 log log2 log10 log1p erf tanh sigmoid sqrt rsqrt pow sin cos tan asin acos atan atan2 "
        "sinh cosh fmod"
    ).split()
)


class _Temp:
    """The key of a value inside a merged kernel (group functions can be inlined more than once)."""


@dataclass
class _Step:
    prim: tvm.ir.GlobalVar
    args: list[Any]  # keys: outer expressions (main's vars and constants) or _Temp
    out: Any  # key
    call: relax.Call  # the original call_tir (for its attrs and output type)


@dataclass
class _Unit:
    """What one binding of ``main`` computes, as a flat list of call_tir steps."""

    name: str  # of the kernel this binding calls
    steps: list[_Step]
    inputs: list[Any] = field(default_factory=list)  # outer expressions the steps read
    arithmetic: float = (
        0.0  # operations per element (of a layout unit), recomputed at each read once pulled into a consumer
    )
    broadcast_only: bool = False  # (of a layout unit) only element-wise and broadcast steps: AutoInline inlines it

    def computes(self, key: Any) -> bool:
        return any(_same(step.out, key) for step in self.steps)

    def merged_into(self, consumer: _Unit) -> _Unit:
        """``self`` placed before ``consumer``, which reads what it computes (steps ``consumer``
        already has, from another path to the same producer, are not repeated)."""
        steps = _in_dependency_order(
            [*(step for step in self.steps if not consumer.computes(step.out)), *consumer.steps]
        )
        merged = _Unit(consumer.name, steps)
        merged.inputs = _unique(
            [arg for step in steps for arg in step.args if not isinstance(arg, _Temp) and not merged.computes(arg)]
        )
        return merged


def _in_dependency_order(steps: list[_Step]) -> list[_Step]:
    """``steps`` ordered so that each comes after the steps computing what it reads."""
    ordered: list[_Step] = []
    pending = list(steps)
    while pending:
        ready = next(
            step
            for step in pending
            if not any(_same(other.out, arg) for arg in step.args for other in pending if other is not step)
        )
        ordered.append(ready)
        pending.remove(ready)
    return ordered


def _same(a: Any, b: Any) -> bool:
    return a is b or (isinstance(a, tvm.ir.Node) and isinstance(b, tvm.ir.Node) and a.same_as(b))


def _call_tir_parts(value: Any) -> tuple[tvm.ir.GlobalVar, list] | None:
    if not isinstance(value, relax.Call) or not value.op.same_as(_CALL_TIR) or len(value.args) != 2:
        return None  # a third argument carries symbolic shape values: not handled
    if not isinstance(value.args[1], relax.Tuple) or not isinstance(value.ty, relax.TensorType):
        return None
    return value.args[0], list(value.args[1].fields)


class _Analysis:
    def __init__(self, mod: IRModule):
        self.mod = mod
        self._kernels: dict[str, tuple[int, float | None]] = {}

    def unit(self, var: relax.Var, value: Any) -> _Unit | None:
        parts = _call_tir_parts(value)
        if parts is not None:
            prim, args = parts
            return _Unit(prim.name_hint, [_Step(prim, args, var, value)], _unique(args))
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
            return self._group_unit(var, value)
        return None

    def _group_unit(self, var: relax.Var, call: relax.Call) -> _Unit | None:
        func = self.mod[call.op]
        if not isinstance(func, relax.Function) or not (func.attrs and func.attrs.get("Primitive")):
            return None
        body = func.body
        if not isinstance(body, relax.SeqExpr) or len(body.blocks) != 1:
            return None
        keys: list[tuple[Any, Any]] = list(zip(func.params, call.args, strict=True))
        steps = []
        for binding in body.blocks[0].bindings:
            parts = _call_tir_parts(binding.value) if isinstance(binding, relax.VarBinding) else None
            if parts is None:
                return None
            prim, args = parts
            out = var if binding.var.same_as(body.body) else _Temp()
            steps.append(_Step(prim, [_lookup(keys, a) for a in args], out, binding.value))
            keys.append((binding.var, out))
        if not steps or steps[-1].out is not var:
            return None
        return _Unit(call.op.name_hint, steps, _unique(list(call.args)))

    def classify(self, unit: _Unit) -> str:
        """ "layout" (moves data, at most one operation per element: ``unit.arithmetic`` is set),
        "reducing" (holds a reduction or a matmul), or "".

        A convolution takes no producers: it reads each input element (kernel size x output
        channels) times, and a transpose and an add inlined into those reads made a 3x3
        convolution of the attention block far slower than it and the separate kernel together.
        Staging the producer inside the convolution's kernel (computed once, not inlined) tuned
        slower still (experiments/README.md, "The inference lowering these numbers rest on")."""
        kernels = [self._kernel(step.prim) for step in unit.steps]
        if all(pattern <= _INJECTIVE and arithmetic is not None for pattern, arithmetic in kernels):
            unit.arithmetic = sum(arithmetic for _, arithmetic in kernels)
            unit.broadcast_only = all(pattern <= _BROADCAST for pattern, _ in kernels)
            return "layout" if unit.arithmetic <= _MAX_ARITHMETIC else ""
        if any(pattern in _REDUCING for pattern, _ in kernels) and not any(
            "conv" in step.prim.name_hint for step in unit.steps
        ):
            return "reducing"
        return ""

    def epilogue_inputs(self, unit: _Unit) -> list[Any]:
        """What the steps after the unit's last matmul or reduction read."""
        reducing = [i for i, step in enumerate(unit.steps) if self._kernel(step.prim)[0] in _REDUCING]
        after = unit.steps[reducing[-1] + 1 :] if reducing else []
        return _unique([arg for step in after for arg in step.args if not isinstance(arg, _Temp)])

    def _kernel(self, prim: tvm.ir.GlobalVar) -> tuple[int, float | None]:
        """(op pattern, operations per output element; None where a math intrinsic is called)."""
        name = prim.name_hint
        if name not in self._kernels:
            func = self.mod[prim]
            pattern = int(func.attrs.get("op_pattern", 8)) if func.attrs else 8
            self._kernels[name] = (pattern, _arithmetic(func) if pattern <= _INJECTIVE else None)
        return self._kernels[name]


def _arithmetic(func: tvm.tirx.PrimFunc) -> float | None:
    """Operations per output element, None where a math intrinsic (exp, erf, sqrt...) is called.
    (TVM 0.27 has no Python TIR visitor; the printed script names every intrinsic call.)"""
    if any(name in _MATH_CALLS for name in re.findall(r"\bT\.(\w+)\(", func.script())):
        return None
    elements = _output_elements(func)
    return prim_func_flops(tvm.IRModule({"main": func})) / elements if elements else None


def _output_elements(func: tvm.tirx.PrimFunc) -> int:
    output = func.params[-1]  # legalized kernels write their (single) output through the last argument
    try:
        return math.prod(int(d) for d in output.shape)
    except (TypeError, AttributeError):
        return 0


def _lookup(keys: list[tuple[Any, Any]], expr: Any) -> Any:
    for key, value in keys:
        if _same(key, expr):
            return value
    return expr  # a constant written inside the group function


def _unique(exprs: list) -> list:
    out: list = []
    for expr in exprs:
        if not any(_same(expr, seen) for seen in out):
            out.append(expr)
    return out


def _emit_unit(unit: _Unit, name: str) -> relax.Function:
    bb = relax.BlockBuilder()
    params = [relax.Var(f"p{i}", expr.ty) for i, expr in enumerate(unit.inputs)]
    env: list[tuple[Any, Any]] = list(zip(unit.inputs, params, strict=True))
    with bb.function(name, params, attrs={"Primitive": True}, private=True):
        with bb.dataflow():
            for step in unit.steps:
                args = [_lookup(env, a) for a in step.args]
                call = relax.Call(step.call.op, [step.prim, relax.Tuple(args)], step.call.attrs, step.call.ty_args)
                env.append((step.out, bb.emit(call)))
            output = bb.emit_output(env[-1][1])
        bb.emit_func_output(output)
    return bb.get()[name]


def _unit_name(unit: _Unit) -> str:
    """The consumer's name: the kernel is still its matmul or reduction."""
    return "fused_layout_" + unit.name.removeprefix("fused_")


@tvm.transform.module_pass(opt_level=0, name="FuseLayoutIntoConsumers")
class FuseLayoutIntoConsumers:
    """Merge layout-only kernels into the reductions and matmuls that read them; with
    ``into_attention`` False, not into the products of two activations (attention's)."""

    def __init__(self, into_attention: bool = True) -> None:
        self.into_attention = into_attention

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        analysis = _Analysis(mod)
        builder = relax.BlockBuilder(mod)
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function) or (func.attrs and func.attrs.get("Primitive")):
                continue
            blocks = [
                self._rewrite_block(block, analysis, builder) if isinstance(block, relax.DataflowBlock) else block
                for block in func.body.blocks
            ]
            body = relax.SeqExpr(blocks, func.body.body)
            builder.update_func(gv, relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs))
        return builder.get()

    def _rewrite_block(
        self, block: relax.DataflowBlock, analysis: _Analysis, builder: relax.BlockBuilder
    ) -> relax.DataflowBlock:
        units: list[tuple[relax.Var, _Unit, str]] = []
        for binding in block.bindings:
            unit = analysis.unit(binding.var, binding.value) if isinstance(binding, relax.VarBinding) else None
            if unit is not None:
                units.append((binding.var, unit, analysis.classify(unit)))
        users = relax.analysis.udchain(block)
        layouts = [
            (var, unit, len(users.get(var, [])) + (0 if isinstance(var, relax.DataflowVar) else 1))
            for var, unit, kind in units
            if kind == "layout"
        ]
        replaced: list[tuple[relax.Var, relax.Call]] = []
        for var, unit, kind in units:
            if kind != "reducing":
                continue
            merged = unit
            # (input, operations recomputed per read of it, whether the epilogue reads it)
            epilogue = analysis.epilogue_inputs(unit)
            read_costs = [(expr, 0.0, any(_same(expr, e) for e in epilogue)) for expr in unit.inputs]
            takes = layouts if not _tensorized(unit) else [layout for layout in layouts if not _reshape_only(layout[1])]
            if not self.into_attention and _of_two_activations(unit):
                takes = []
            while (producer := _next_producer(read_costs, takes)) is not None:
                pulled_var, pulled, cost = producer
                by_epilogue = any(_same(e, pulled_var) and ep for e, _, ep in read_costs)
                merged = pulled.merged_into(merged)
                read_costs = [(e, c, ep) for e, c, ep in read_costs if not _same(e, pulled_var)] + [
                    (e, cost, by_epilogue) for e in pulled.inputs if not merged.computes(e)
                ]
            if merged is not unit:
                name = _unit_name(merged)
                gvar = builder.add_func(_emit_unit(merged, name), name)
                replaced.append((var, builder.normalize(relax.Call(gvar, merged.inputs))))
        if not replaced:
            return block
        bindings = []
        for binding in block.bindings:
            new = next((value for var, value in replaced if var.same_as(binding.var)), None)
            bindings.append(relax.VarBinding(binding.var, new) if new is not None else binding)
        return relax.DataflowBlock(bindings)


def _tensorized(unit: _Unit) -> bool:
    """Whether ``unit`` holds a bf16 product by a packed weight (``tuner.lowering.bf16.kernels``): its
    micro-kernel reads the operand through a pointer, so a producer pulled in stays a pass of its own."""
    return any("bf16_dense" in step.prim.name_hint for step in unit.steps)


def _of_two_activations(unit: _Unit) -> bool:
    """Whether ``unit`` is an fp32 matmul of two activations (attention's scores or context), no weight in
    it. Pulled in, a head's transpose left MetaSchedule a kernel it tiles badly: BERT-base's scores (the
    keys transposed inside) ran at 59 GFLOP/s, 423 us a layer; apart, 123 us and a 10-17 us transpose.
    (The bf16 products on AMX pack their second operand themselves, measured as they are.)"""
    matmuls = [step for step in unit.steps if "matmul" in step.prim.name_hint and "bf16" not in step.prim.name_hint]
    return bool(matmuls) and not any(isinstance(arg, Constant) for step in matmuls for arg in step.args)


def _reshape_only(unit: _Unit) -> bool:
    """Whether ``unit`` only reshapes: left out of its consumer, it is a view (RewriteDataflowReshape)
    rather than a copy (the patches of ResNet-50's first convolution: 5.6 MB copied inside its product)."""
    return all(re.fullmatch(r"reshape\d*", step.prim.name_hint) for step in unit.steps)


def _next_producer(
    read_costs: list[tuple[Any, float, bool]], layouts: list[tuple[relax.Var, _Unit, int]]
) -> tuple[relax.Var, _Unit, float] | None:
    """A layout kernel the consumer reads that it may absorb, with the operations then recomputed per
    read along that path: one that only moves data (copied into every consumer), or one with
    arithmetic whose only reader is this consumer, within what a read may recompute.

    What the epilogue (the steps after the matmul or reduction) reads is absorbed only if it is
    element-wise or a broadcast (a squeeze, an expand_dims): MetaSchedule's AutoInline inlines those
    into the epilogue. A transpose or a reshape it does not inline (on CPUs it inlines only reads in
    the order of the writes), and left as a block of its own it is a second producer of the epilogue,
    which MultiLevelTiling then cannot move under the matmul's tiles: its reverse_compute_at raises
    and the kernel has no design space (MobileViT's residual, unfolded into patches). Left out, a pure
    reshape becomes a view (RewriteDataflowReshape) and a transpose a kernel of its own."""
    for var, unit, uses in layouts:
        reads = [(c, ep) for e, c, ep in read_costs if _same(e, var)]
        if not reads:
            continue
        cost = reads[0][0]
        if any(ep for _, ep in reads) and not unit.broadcast_only:
            continue
        if unit.arithmetic == 0 or (uses == 1 and cost + unit.arithmetic <= _MAX_ARITHMETIC):
            return var, unit, cost + unit.arithmetic
    return None
