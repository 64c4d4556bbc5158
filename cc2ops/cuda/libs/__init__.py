"""Thin adapters over NVIDIA libraries, above :mod:`cc2ops.cuda.runtime`.

:mod:`~.cublas` (cuBLAS: row-major GEMMs, strided batches, TF32, per-handle
workspaces for graph capture). Each adapter keeps only policy (layout folding,
precision, workspaces) over the library's calls; nothing is loaded at import.
"""
