"""CUDA without PyTensor: the bottom layer of :mod:`cc2ops.cuda`.

:mod:`~.availability` (whether CUDA can be used, and why not),
:mod:`~.device` (labels, contexts, streams, the memory pool),
:mod:`~.array` (GPUArray helpers: allocate, copy, fill, views),
:mod:`~.compile` (kernel templates, nvcc, the cubin cache, launching),
:mod:`~.precision` (the TF32 switch), :mod:`~.profile` (host and device time
apart), :mod:`~.autotune` (timing candidates, the on-disk choices),
:mod:`~.cudagraph` (stream capture and graph replay, through cuda-bindings),
:mod:`~.libraries` (NVIDIA's bindings and libraries, located by one loader).

Nothing here imports PyTensor or the GPU graph core (the import contracts in
``pyproject.toml`` check it), and nothing touches CUDA at import; importing
this package imports none of its modules.
"""
