"""What tests, benchmarks and the example share: the nets and the compare helpers.

- :mod:`cc2ops.testing.nets`: the cuda-convnet2 nets as data (ImageNet,
  CIFAR-10 "11pct" and cuda-convnet's CIFAR-10 "18pct"), the
  :class:`~cc2ops.testing.nets.Network` that builds their graphs with the
  public cc2ops ops, and the momentum-SGD training step of every benchmark,
  test and of ``examples/imagenet/train.py``;
- :mod:`cc2ops.testing.compare`: relative errors and the closeness checks of
  the tests and the benchmarks.

Nothing here imports :mod:`cc2ops.cuda`: GPU parameters, inputs and outputs
come through :mod:`cc2ops.seam` when asked for, so every graph builds on a
machine without CUDA (an import contract in ``pyproject.toml`` keeps it so).
"""

from cc2ops.testing import compare, nets

__all__ = ["compare", "nets"]
