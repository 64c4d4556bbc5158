"""The thread count of the BLAS behind Numba's ``np.dot``, from compiled code.

Numba's ``np.dot`` calls the BLAS that ``scipy.linalg.cython_blas`` links
(scipy's bundled OpenBLAS in a pip install, the environment's OpenBLAS or MKL
under conda). That BLAS runs its own thread pool. The conv kernels of
:mod:`cc2ops.backends.numba` parallelise over images with Numba's threads and
call one GEMM per chunk from each thread; a threaded BLAS under them
oversubscribes the cores (on the 2-core CI machine conv1 of
``benchmarks/bench_cpu.py`` took 220 ms instead of 53 ms), so those kernels
set the BLAS to one thread for the parallel loop and restore its count after.

The count is process-wide state of the library (OpenBLAS built with pthreads
has no per-thread count): BLAS calls that other Python threads make while a
conv kernel runs are single-threaded for that time; their results do not
change.

:func:`get_blas_threads` and :func:`set_blas_threads` are Numba intrinsics
that call the library through two symbols registered with LLVM at import, so
the kernels that use them stay cacheable on disk. Where the library exports
no known thread-count functions (or scipy is missing) the symbols are no-ops
and :func:`get_blas_threads` returns -1; the kernels then keep the library's
threads and run their chunks one after another.
"""

from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
from llvmlite import ir
from numba import cfunc, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["LIBRARY", "get_blas_threads", "set_blas_threads"]

_GET = "cc2ops_blas_get_num_threads"
_SET = "cc2ops_blas_set_num_threads"

#: (get, set) pairs, in lookup order: scipy's wheels prefix OpenBLAS's names
_CANDIDATES = (
    ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
    ("openblas_get_num_threads", "openblas_set_num_threads"),
    ("MKL_Get_Max_Threads", "MKL_Set_Num_Threads"),
)


def _address(fn: ctypes._CFuncPtr) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


def _library_functions() -> tuple[str, int, int] | None:
    """(set function's name, get address, set address) in the BLAS that
    ``scipy.linalg.cython_blas`` links, else None."""
    try:
        from scipy.linalg import cython_blas

        # dlsym through cython_blas's handle searches its dependencies: the
        # very library Numba's np.dot ends up in
        lib = ctypes.CDLL(cython_blas.__file__)
    except (ImportError, OSError):
        return None
    for get, set_ in _CANDIDATES:
        try:
            return set_, _address(getattr(lib, get)), _address(getattr(lib, set_))
        except AttributeError:
            continue
    return None


def _install() -> str | None:
    found = _library_functions()
    if found is None:

        @cfunc(types.intc())
        def unknown_count():
            return -1

        @cfunc(types.void(types.intc))
        def ignore_count(n):
            pass

        llvm.add_symbol(_GET, unknown_count.address)
        llvm.add_symbol(_SET, ignore_count.address)
        return None
    name, get_addr, set_addr = found
    llvm.add_symbol(_GET, get_addr)
    llvm.add_symbol(_SET, set_addr)
    return name


#: The thread-count function in use (e.g. ``"scipy_openblas_set_num_threads"``),
#: or None where the BLAS's threads cannot be set
LIBRARY: str | None = _install()


@intrinsic
def get_blas_threads(typingctx):
    """The BLAS's thread count (-1 where it cannot be read or set)."""

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32), [])
        fn = cgutils.get_or_insert_function(builder.module, fnty, _GET)
        return builder.call(fn, [])

    return types.intc(), codegen


@intrinsic
def set_blas_threads(typingctx, n):
    """Set the BLAS's thread count (a no-op where it cannot be set)."""
    if not isinstance(n, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(32)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, _SET)
        value = context.cast(builder, args[0], signature.args[0], types.intc)
        builder.call(fn, [value])
        return context.get_dummy_value()

    return types.void(n), codegen
