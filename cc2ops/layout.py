"""The two axis orders cc2ops accepts, and the conversions between them.

``bc01`` (default)
    images (B, C, H, W); convolution filters (F, C/groups, kh, kw).
``c01b``
    images (C, H, W, B), cuda-convnet's native order; convolution filters
    (C/groups, kh, kw, F), as pylearn2's cuda-convnet wrapper used them.

The ops compute in ``bc01``. The builders (``conv2d``, ``max_pool2d``, ...)
accept ``layout="c01b"`` and insert the ``DimShuffle`` pair around the op, so
the graph states the conversion explicitly and every backend (CPU, GPU,
multi-GPU) sees one op semantics.
"""

from __future__ import annotations

import pytensor.tensor as pt

LAYOUTS = ("bc01", "c01b")

# image axes: bc01 position of each c01b axis, and back
_C01B_TO_BC01 = (3, 0, 1, 2)
_BC01_TO_C01B = (1, 2, 3, 0)
# filter axes: c01b filters are (C/g, kh, kw, F); bc01 are (F, C/g, kh, kw)
_FILTERS_C01B_TO_BC01 = (3, 0, 1, 2)


def check_layout(op: str, layout: str) -> str:
    """Return ``layout`` if it is known, else raise ``ValueError``."""
    if layout not in LAYOUTS:
        raise ValueError(f"{op}: layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def images_to_bc01(x: pt.TensorVariable, layout: str) -> pt.TensorVariable:
    """Images in ``layout`` order -> (B, C, H, W)."""
    return x if layout == "bc01" else x.dimshuffle(*_C01B_TO_BC01)


def images_from_bc01(x: pt.TensorVariable, layout: str) -> pt.TensorVariable:
    """Images (B, C, H, W) -> ``layout`` order."""
    return x if layout == "bc01" else x.dimshuffle(*_BC01_TO_C01B)


def filters_to_bc01(w: pt.TensorVariable, layout: str) -> pt.TensorVariable:
    """Filters in ``layout`` order -> (F, C/groups, kh, kw)."""
    return w if layout == "bc01" else w.dimshuffle(*_FILTERS_C01B_TO_BC01)


def axes_doc(layout: str) -> str:
    """The image axis order of ``layout`` as error messages print it."""
    return "(B, C, H, W)" if layout == "bc01" else "(C, H, W, B)"
