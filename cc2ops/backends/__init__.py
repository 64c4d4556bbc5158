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
  runs at once.

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

#: cc2ops backend module -> the PyTensor dispatch package that triggers it.
BACKENDS: dict[str, str] = {
    "numba": "pytensor.link.numba.dispatch",
    "jax": "pytensor.link.jax.dispatch",
    "pytorch": "pytensor.link.pytorch.dispatch",
    "mlx": "pytensor.link.mlx.dispatch",
}


def _loader(name: str):
    def load(_module) -> None:
        importlib.import_module(f"cc2ops.backends.{name}")

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
