"""The operator class of a kernel: what it computes, with its shapes left out, so that a schedule
tuned for one kernel can be tried on another of the same class (transfer-tuning).

Two kernels are of one class when their computation blocks match in order: the same block
names (numbers stripped), the same number of spatial and of reduction iterators in each, the
same data types. Every conv2d with padding, of whatever channels, image size or stride, is one
class; a conv2d without padding (no padding block) is another, and so is a matmul. A schedule's
trace names blocks and splits loops by position, so this is exactly what it needs to apply.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import tvm

from tuner.spaces import metaschedule as msc

_NUMBER = re.compile(r"\d+(?=[_\-.]|$)")  # "conv2d16" -> "conv2d", "batch_norm2_add" -> "batch_norm_add"
_SEPARATORS = re.compile(r"([_\-.])[_\-.]+")


def base_name(name: str) -> str:
    """A task or block name without the numbers TVM and model builders append to tell instances
    apart (``fused_batch_norm2_add1_relu2`` -> ``fused_batch_norm_add_relu``; ``conv2d`` stays)."""
    return _SEPARATORS.sub(r"\1", _NUMBER.sub("", name)).strip("_-.") or name


@dataclass(frozen=True)
class OperatorClass:
    label: str  # the task name without numbers, for people; not compared
    signature: tuple  # per block: (name, spatial iterators, reduction iterators, other iterators, dtypes)
    extents: tuple[int, ...]  # every block's iterator extents, in order: the shape within the class

    def matches(self, other: OperatorClass) -> bool:
        return self.signature == other.signature

    def distance(self, other: OperatorClass) -> float:
        """How far apart two kernels of one class are in shape: the summed |log2| ratio of their
        iterator extents (0 for identical shapes)."""
        return sum(
            abs(math.log2(max(a, 1)) - math.log2(max(b, 1))) for a, b in zip(self.extents, other.extents, strict=True)
        )


def kernel_class(mod: tvm.IRModule, name: str) -> OperatorClass | None:
    """``operator_class``, or None for a kernel it cannot describe (one written without a root block,
    such as a cumulative sum's generic loop): such a kernel has no siblings and takes no transfer."""
    try:
        return operator_class(mod, name)
    except Exception:  # noqa: BLE001 - TVM's ScheduleError and its kin: simply no class
        return None


def operator_class(mod: tvm.IRModule, name: str = "") -> OperatorClass:
    """The operator class of an unscheduled kernel ``mod`` (``{"main": PrimFunc}``) named ``name``."""
    blocks = msc.kernel_blocks(mod)
    signature = tuple((base_name(b.name), len(b.spatial), len(b.reduction), b.other, b.dtypes) for b in blocks)
    extents = tuple(e for b in blocks for e in (*b.spatial, *b.reduction))
    return OperatorClass(base_name(name) if name else "/".join(s[0] for s in signature), signature, extents)
