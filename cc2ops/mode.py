"""The registered CPU mode of cc2ops.

``cc2ops.mode`` is PyTensor's ``fast_run`` rewrites plus every cc2ops CPU
rewrite (tag ``cc2ops``), run by the ``cvm`` linker: PyTensor's own ops run as
compiled C (g++ is needed; without it PyTensor falls back to Python), cc2ops
ops run their vectorised numpy ``perform``. It is registered under the name
``"CC2OPS"``, so ``pytensor.function(..., mode="CC2OPS")`` works too.

Why not the default mode: PyTensor 3's default linker is Numba, which runs
ops it has no Numba implementation for in object mode, one Python call per op
per run. cc2ops graphs work there (the fusion rewrite is in ``fast_run`` and
applies too), but ``cvm`` is the linker this package is tested and measured
with. The GPU mode lives in :func:`cc2ops.cuda.mode`.
"""

from __future__ import annotations

from pytensor.compile.mode import Mode, predefined_modes, register_mode

import cc2ops.rewriting  # noqa: F401  (registers the cc2ops rewrite databases)

MODE_NAME = "CC2OPS"

mode = Mode(linker="cvm", optimizer="fast_run").including("cc2ops")

if MODE_NAME not in predefined_modes:
    register_mode(MODE_NAME, mode)
