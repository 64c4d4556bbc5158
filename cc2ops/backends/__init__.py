"""PyTensor backend implementations of the cc2ops ops, one module per backend.

Each module ``cc2ops.backends.<name>`` registers the cc2ops ops with one of
PyTensor's own dispatchers (``numba_funcify``, ``jax_funcify``,
``pytorch_funcify``, ``mlx_funcify``) when it is imported. The core never
imports them: a post-import hook (``wrapt.register_post_import_hook``)
imports ``cc2ops.backends.<name>`` right after PyTensor loads its dispatch
package for that backend, which PyTensor's linker does before converting a
graph. So

- ``import cc2ops`` imports neither numba, jax, torch nor mlx;
- a graph compiled in any mode finds the cc2ops implementations of that
  mode's backend, however the dispatch package was reached (a linker,
  ``pymc.sampling.jax``, a direct ``jax_funcify`` call);
- if PyTensor's dispatch package was already imported before cc2ops, the hook
  runs at once;
- a backend module that fails to import (its library is installed, since
  PyTensor's dispatch package imported it) raises ``ImportError`` from that
  import, so a broken backend can never leave the cc2ops ops (or the fused
  softmax-loss ops the ``fast_run`` rewrite inserts) without an
  implementation silently.

:mod:`cc2ops.backends.rewriting` (imported here, so at ``import cc2ops``)
holds the ``jax``/``mlx``-tagged rewrite that makes the (H, W) inputs of the
gradient ops static; :mod:`cc2ops.backends._generic` the op bodies that the
JAX, PyTorch and MLX modules share.

=============  ====================================  =====================
module         PyTensor dispatch package              needs
=============  ====================================  =====================
``numba``      ``pytensor.link.numba.dispatch``        numba (PyTensor's own)
``jax``        ``pytensor.link.jax.dispatch``          jax
``pytorch``    ``pytensor.link.pytorch.dispatch``      torch
``mlx``        ``pytensor.link.mlx.dispatch``          mlx
=============  ====================================  =====================
"""

from __future__ import annotations

import importlib
import importlib.util

from wrapt import register_post_import_hook

# the static-shape rewrite for JAX/MLX: registered at ``import cc2ops``, since
# the modes query their rewrite databases before the linker imports a backend
from cc2ops.backends import rewriting  # noqa: F401

#: cc2ops backend module -> the PyTensor dispatch package that triggers it.
BACKENDS: dict[str, str] = {
    "numba": "pytensor.link.numba.dispatch",
    "jax": "pytensor.link.jax.dispatch",
    "pytorch": "pytensor.link.pytorch.dispatch",
    "mlx": "pytensor.link.mlx.dispatch",
}


def _loader(name: str):
    def load(_module) -> None:
        try:
            importlib.import_module(f"cc2ops.backends.{name}")
        except Exception as e:
            # Loud on purpose: without the module every cc2ops op, and the
            # ops the fast_run softmax-loss fusion inserts into graphs that
            # use no cc2ops op, would fail later with "No conversion".
            raise ImportError(
                f"cc2ops: cc2ops.backends.{name} failed to import after "
                f"{BACKENDS[name]}, so the cc2ops ops would have no {name} "
                f"implementation: {type(e).__name__}: {e}"
            ) from e

    return load


def install_hooks() -> None:
    """Arrange for each backend module to load after PyTensor's dispatch package.

    Idempotent in effect: importing an already imported module is a no-op.
    A backend whose module does not exist yet is skipped.
    """
    for name, trigger in BACKENDS.items():
        if importlib.util.find_spec(f"cc2ops.backends.{name}") is None:
            continue
        register_post_import_hook(_loader(name), trigger)
