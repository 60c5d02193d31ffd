"""A tile tuned for one loop extent refitted to another: how a schedule moves between kernels of one kind at
different shapes (transfer-tuning across runs, sibling kernels inside one)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def adapt_tile(decision: Sequence[int], extent: int, max_innermost: int = 0) -> list[int]:
    """A SamplePerfectTile decision made for another loop extent, refitted to ``extent``.

    From the innermost factor outwards, each factor becomes the divisor of what is left of the
    extent that is nearest to it in ratio (itself where it divides; the innermost at most
    ``max_innermost`` when that is positive), and the outermost factor takes the rest: tile sizes
    stay as tuned where they fit and close to them where they do not ([1, 4, 7, 1], tuned for 28,
    becomes [1, 4, 8, 1] on 32). Left alone, TVM would put the rest in the first factor that does
    not divide, all of it ([4, 2, 16] on 100 becomes [1, 1, 100] there, [1, 5, 20] here)."""
    if math.prod(decision) == extent:
        return list(decision)
    factors = [1] * len(decision)
    rest = extent
    for i in range(len(decision) - 1, 0, -1):
        limit = max_innermost if i == len(decision) - 1 and max_innermost > 0 else rest
        factors[i] = _nearest_divisor(rest, int(decision[i]), limit)
        rest //= factors[i]
    factors[0] = rest
    return factors


def _nearest_divisor(n: int, wanted: int, limit: int) -> int:
    """The divisor of ``n`` (at most ``limit``) closest to ``wanted`` in ratio; the smaller on a tie."""
    divisors = {d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i) if d <= limit}
    return min(divisors, key=lambda d: (abs(math.log(d / max(wanted, 1))), d))
