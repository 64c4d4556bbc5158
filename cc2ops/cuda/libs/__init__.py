"""Thin adapters over NVIDIA libraries, above :mod:`cc2ops.cuda.runtime`.

:mod:`~.cublas` (cuBLAS through ``nvmath.bindings.cublas``: row-major GEMMs,
strided batches, TF32, per-handle workspaces for graph capture) and
:mod:`~.nccl` (NCCL through nccl4py: one communicator per device in one
process, group calls on cc2ops's streams). Each adapter keeps only policy
(layout folding, precision, workspaces, which stream) over NVIDIA's maintained
bindings; libraries are found by one loader
(:mod:`cc2ops.cuda.runtime.libraries`, cuda-pathfinder). Nothing is imported
or loaded at import.
"""
