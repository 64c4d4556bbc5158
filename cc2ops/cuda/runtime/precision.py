"""The TF32 switch of the GPU matrix products.

Like ``torch.backends.cuda.matmul.allow_tf32``: off by default, so float32
products are true float32 (24-bit mantissa). When on, float32 GEMMs (and the
convolutions that use them) may round their inputs to TF32 (10-bit mantissa)
on tensor cores: several times faster, about 1e-3 relative error. The flag is
global and read when a product RUNS, not when a graph is built or compiled, so
one compiled function can be timed both ways.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["set_allow_tf32", "get_allow_tf32", "allow_tf32"]

_allow_tf32 = False


def set_allow_tf32(flag: bool) -> None:
    """Allow (``True``) or forbid (``False``, the default) TF32 in float32 products."""
    global _allow_tf32
    if not isinstance(flag, bool):
        raise TypeError(
            f"set_allow_tf32: flag must be a bool, got {type(flag).__name__}"
        )
    _allow_tf32 = flag


def get_allow_tf32() -> bool:
    """Whether float32 products may use TF32 now."""
    return _allow_tf32


@contextmanager
def allow_tf32(flag: bool = True) -> Iterator[None]:
    """Set the TF32 switch inside a ``with`` block, restoring it afterwards."""
    old = _allow_tf32
    set_allow_tf32(flag)
    try:
        yield
    finally:
        set_allow_tf32(old)
