"""CUDA kernels: Mako templates, nvcc with an on-disk cubin cache, loading, launching.

Templates
---------
Each kernel family is one CUDA C file ``KERNEL_DIR/<family>.cu``, a Mako
template rendered from a small dict of constants (ints, floats, strings,
bools) with ``strict_undefined=True``, so a missing constant is an error, not
an empty string. Templates include the shared headers with
``<%include file="common.cuh"/>`` (so the rendered source is self-contained
and the cache key covers the headers too). Kernels are ``extern "C"`` and take
their name from the ``name`` constant (``extern "C" __global__ void
${name}(...)``); :func:`kernel_name` builds names that carry the
specialisation, e.g. ``copy_u4``. Mako's line syntax applies inside
templates: a line starting with ``%`` is control flow and one starting with
``##`` a comment, so never start a line with the ``##`` pasting operator.

Compiling
---------
:func:`compile_cubin` runs ``nvcc -cubin -arch=<sm_XY> -O3 -std=c++17
<options>`` (no ``--use_fast_math`` unless the caller asks: correctness
first). Results are cached on disk in ``CC2OPS_CACHE_DIR`` (default
``~/.cache/cc2ops/kernels``) under the sha256 of (source, flags, options, the
``nvcc --version`` text, arch); files are written atomically, so concurrent
processes share the cache and a second process loads kernels without
compiling (it only asks ``nvcc --version``, once). ``CC2OPS_DEBUG=1`` adds
``-lineinfo`` and keeps the rendered ``.cu`` next to its cubin. A failed
compile raises :class:`KernelCompileError` with the path of the rendered
source (always kept on failure; nvcc's messages refer to it by that path and
line) and nvcc's log. nvcc is looked for in
``$CUDA_HOME/bin``, ``$CUDA_PATH/bin``, ``PATH`` and ``/usr/local/cuda/bin``.

Loading and launching
---------------------
:func:`get_module` / :func:`get_kernel` render, compile for the device's own
arch and load with ``pycuda.driver.module_from_buffer``, memoised per
(physical device, family, constants). :func:`launch` activates the device and
launches on its stream.

Arch-specific kernels
---------------------
Some instructions exist only in an arch-specific target (``wgmma`` needs
``sm_90a``, which runs on compute capability 9.0 and nowhere else). A family
whose constants select such instructions registers a rule with
:func:`register_arch_suffix`; :func:`kernel_arch` turns the device's arch
into the target a kernel compiles for (``sm_90`` -> ``sm_90a``), and
:func:`get_module`, :func:`precompile` and the compile test all go through
it. The constants decide the target, so every key that covers the constants
covers it too (and the disk cache's key has the arch itself).

Variants
--------
GPU op modules register representative specialisations of their templates
with :func:`register_variants`; the CPU test suite renders and compiles every
one for ``sm_90`` (or the arch-specific target :func:`kernel_arch` names), so
template errors show up without a GPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from cc2ops.cuda.runtime.availability import driver
from cc2ops.cuda.runtime.device import (
    device_of,
    get_device,
    is_gpuarray,
    ptr,
    register_shutdown_hook,
)
from cc2ops.cuda.runtime.signature import check_arguments, kernel_signatures
from cc2ops.cuda.runtime.tape import note_launch, recorder

__all__ = [
    "KERNEL_DIR",
    "KernelCompileError",
    "NvccNotFoundError",
    "render",
    "kernel_name",
    "register_namer",
    "register_arch_suffix",
    "kernel_arch",
    "compile_cubin",
    "find_nvcc",
    "nvcc_version",
    "cache_dir",
    "debug_enabled",
    "compile_stats",
    "reset_compile_stats",
    "get_module",
    "get_kernel",
    "launch",
    "KernelSpec",
    "precompile",
    "kernel_cache",
    "register_variants",
    "all_variants",
    "families",
]

_log = logging.getLogger(__name__)

#: Where the ``<family>.cu`` templates and shared ``.cuh`` headers live.
KERNEL_DIR = Path(__file__).resolve().parent.parent / "kernels"

CACHE_ENV = "CC2OPS_CACHE_DIR"
DEBUG_ENV = "CC2OPS_DEBUG"
#: Flags every compile gets (part of the cache key).
BASE_FLAGS: tuple[str, ...] = ("-O3", "-std=c++17")
# bump when the cache layout or key recipe changes
_CACHE_FORMAT = 1

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ARCH = re.compile(r"^sm_[0-9]{2,3}[a-z]?$")
_ARCH_SUFFIX = re.compile(r"^[a-z]?$")


class KernelCompileError(RuntimeError):
    """nvcc failed (the message has the rendered source's path and nvcc's log)."""


class NvccNotFoundError(KernelCompileError):
    """No nvcc in CUDA_HOME, CUDA_PATH, PATH or /usr/local/cuda/bin."""


def debug_enabled() -> bool:
    """Whether ``CC2OPS_DEBUG`` asks for line info and kept sources."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def cache_dir() -> Path:
    """The cubin cache: ``CC2OPS_CACHE_DIR``, else ``~/.cache/cc2ops/kernels``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "cc2ops" / "kernels"


# --------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------

_lookup_lock = threading.Lock()
_lookup: Any = None


def _template_lookup() -> Any:
    global _lookup
    if _lookup is None:
        with _lookup_lock:
            if _lookup is None:
                try:
                    from mako.lookup import TemplateLookup
                except ImportError as e:
                    raise ImportError(
                        "cc2ops.cuda.runtime.compile needs Mako to render kernel "
                        "templates "
                        '(pip install mako, or pip install -e ".[cuda]")'
                    ) from e
                _lookup = TemplateLookup(
                    directories=[str(KERNEL_DIR)],
                    strict_undefined=True,
                    input_encoding="utf-8",
                    filesystem_checks=True,
                )
    return _lookup


def families() -> list[str]:
    """The kernel families that have a template in :data:`KERNEL_DIR`."""
    return sorted(p.stem for p in KERNEL_DIR.glob("*.cu"))


def _check_family(family: Any) -> str:
    if not isinstance(family, str) or not _IDENT.match(family):
        raise ValueError(
            f"cc2ops.cuda: kernel family must be an identifier, got {family!r}"
        )
    if not (KERNEL_DIR / f"{family}.cu").is_file():
        raise ValueError(
            f"cc2ops.cuda: no kernel template {family}.cu in {KERNEL_DIR} "
            f"(families: {', '.join(families()) or 'none'})"
        )
    return family


def _check_consts(where: str, consts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in consts.items():
        if isinstance(value, np.generic):
            value = value.item()
        if not isinstance(value, (bool, int, float, str)):
            raise TypeError(
                f"{where}: constant {key}={value!r} must be an int, float, str or "
                "bool, "
                f"got {type(value).__name__}"
            )
        out[key] = value
    return out


def render(family: str, /, **consts: Any) -> str:
    """Render ``KERNEL_DIR/<family>.cu`` with ``consts``.

    Raises
    ------
    ValueError
        Unknown family, or a constant the template uses is missing.
    TypeError
        A constant that is not an int, float, str or bool.
    """
    family = _check_family(family)
    consts = _check_consts(f"render({family})", consts)
    template = _template_lookup().get_template(f"{family}.cu")
    try:
        return template.render(**consts)
    except NameError as e:
        raise ValueError(
            f"render({family}): the template uses a constant that was not given: {e} "
            f"(given: {', '.join(sorted(consts)) or 'none'})"
        ) from e


_namers: dict[str, Callable[..., str]] = {}


def register_namer(family: str) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Decorator: ``namer(**consts) -> str`` decides ``family``'s kernel names."""

    def decorate(fn: Callable[..., str]) -> Callable[..., str]:
        _namers[family] = fn
        return fn

    return decorate


_arch_suffixes: dict[str, Callable[..., str]] = {}


def register_arch_suffix(
    family: str,
) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Decorator: ``rule(**consts) -> str`` is the arch suffix ``family``'s
    kernel with ``consts`` needs: ``""`` (portable) or a letter (``"a"``: the
    arch-specific target, e.g. ``sm_90a`` for ``wgmma``). See :func:`kernel_arch`."""

    def decorate(fn: Callable[..., str]) -> Callable[..., str]:
        _arch_suffixes[family] = fn
        return fn

    return decorate


def kernel_arch(family: str, arch: str, /, **consts: Any) -> str:
    """The target a kernel of ``family`` with ``consts`` compiles for on ``arch``.

    ``arch`` is a device's (or a cache's) ``sm_XY``; the family's rule (see
    :func:`register_arch_suffix`) may ask for an arch-specific variant, which
    replaces any suffix ``arch`` has: ``kernel_arch("conv_igemm", "sm_90",
    WGMMA=1, ...) == "sm_90a"``. Families without a rule compile for ``arch``.

    Raises
    ------
    ValueError
        ``arch`` is not ``sm_XY[a-z]``, or the rule returned something other
        than ``""`` or one lowercase letter.
    """
    if not isinstance(arch, str) or not _ARCH.match(arch):
        raise ValueError(f"kernel_arch: arch must look like 'sm_90', got {arch!r}")
    rule = _arch_suffixes.get(family)
    if rule is None:
        return arch
    suffix = rule(**consts)
    if not isinstance(suffix, str) or not _ARCH_SUFFIX.match(suffix):
        raise ValueError(
            f"kernel_arch({family}): the arch rule must return '' or one lowercase "
            f"letter, got {suffix!r}"
        )
    if not suffix:
        return arch
    return arch.rstrip("abcdefghijklmnopqrstuvwxyz") + suffix


def _fmt_const(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return repr(value).replace("-", "m").replace(".", "p").replace("+", "")
    return str(value)


def kernel_name(family: str, /, **consts: Any) -> str:
    """A C identifier naming ``family`` specialised by ``consts``.

    A family may register its own convention with :func:`register_namer`
    (e.g. ``pool_max_s3x3_st2x2_f32``); the default is the family followed by
    ``<key><value>`` for every constant in key order, except ``name``.
    """
    consts = _check_consts(f"kernel_name({family})", consts)
    namer = _namers.get(family)
    if namer is not None:
        name = namer(**consts)
    else:
        parts = [family] + [
            f"{k}{_fmt_const(v)}" for k, v in sorted(consts.items()) if k != "name"
        ]
        name = "_".join(parts)
    name = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not _IDENT.match(name):
        name = f"k_{name}"
    return name


# --------------------------------------------------------------------------
# nvcc and the disk cache
# --------------------------------------------------------------------------

_stats_lock = threading.Lock()
_stats = {"nvcc_runs": 0, "cache_hits": 0}
_version_cache: dict[str, str] = {}


def compile_stats() -> dict[str, int]:
    """Counts of this process: ``nvcc_runs`` and disk ``cache_hits``."""
    with _stats_lock:
        return dict(_stats)


def reset_compile_stats() -> None:
    """Zero the counters of :func:`compile_stats`."""
    with _stats_lock:
        for k in _stats:
            _stats[k] = 0


def _bump(key: str) -> None:
    with _stats_lock:
        _stats[key] += 1


def find_nvcc() -> str | None:
    """Path of nvcc, or ``None`` (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda/bin)."""
    candidates: list[str | None] = []
    for env in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(env)
        if root:
            candidates.append(os.path.join(root, "bin", "nvcc"))
    candidates.append(shutil.which("nvcc"))
    candidates.append("/usr/local/cuda/bin/nvcc")
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def _require_nvcc() -> str:
    nvcc = find_nvcc()
    if nvcc is None:
        raise NvccNotFoundError(
            "cc2ops.cuda: nvcc not found in $CUDA_HOME/bin, $CUDA_PATH/bin, PATH or "
            "/usr/local/cuda/bin; install the CUDA toolkit or set CUDA_HOME"
        )
    return nvcc


def nvcc_version(nvcc: str | None = None) -> str:
    """The ``nvcc --version`` text (part of the cache key), memoised per path."""
    nvcc = nvcc or _require_nvcc()
    text = _version_cache.get(nvcc)
    if text is None:
        proc = subprocess.run(
            [nvcc, "--version"], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise KernelCompileError(
                f"cc2ops.cuda: `{nvcc} --version` failed (exit {proc.returncode}):\n"
                f"{proc.stderr}{proc.stdout}"
            )
        text = proc.stdout.strip()
        _version_cache[nvcc] = text
    return text


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _cache_key(source: str, arch: str, options: tuple[str, ...], version: str) -> str:
    blob = json.dumps(
        [_CACHE_FORMAT, source, list(BASE_FLAGS), list(options), version, arch],
        ensure_ascii=True,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def compile_cubin(source: str, arch: str, options: Sequence[str] = ()) -> bytes:
    """Compile CUDA C ``source`` to a cubin for ``arch`` (e.g. ``"sm_90"``), cached.

    Parameters
    ----------
    source : str
        Self-contained CUDA C (a rendered template).
    arch : str
        ``sm_XY`` target.
    options : sequence of str
        Extra nvcc flags (e.g. ``("--use_fast_math",)``); part of the key.

    Returns
    -------
    bytes
        The cubin, ready for ``pycuda.driver.module_from_buffer``.

    Raises
    ------
    NvccNotFoundError
        Without nvcc (its ``--version`` text is part of the cache key, so a
        cache hit still asks nvcc for its version; it never compiles then).
    KernelCompileError
        When nvcc fails; the message names the kept source file and has nvcc's log.
    """
    if not isinstance(source, str):
        raise TypeError(
            f"compile_cubin: source must be a str, got {type(source).__name__}"
        )
    if not isinstance(arch, str) or not _ARCH.match(arch):
        raise ValueError(f"compile_cubin: arch must look like 'sm_90', got {arch!r}")
    opts = tuple(options)
    if not all(isinstance(o, str) for o in opts):
        raise TypeError(f"compile_cubin: options must be strings, got {opts!r}")
    debug = debug_enabled()
    if debug and "-lineinfo" not in opts:
        opts = (*opts, "-lineinfo")
    nvcc = find_nvcc()
    version = nvcc_version(nvcc) if nvcc is not None else "no-nvcc"
    key = _cache_key(source, arch, opts, version)
    cdir = cache_dir()
    cubin_path = cdir / f"{key}.cubin"
    source_path = cdir / f"{key}.cu"
    try:
        data = cubin_path.read_bytes()
    except OSError:
        data = b""
    if data:
        _bump("cache_hits")
        _log.debug("cubin cache hit %s", cubin_path)
        if debug and not source_path.exists():
            _atomic_write(source_path, source.encode("utf-8"))
        return data
    nvcc = _require_nvcc()
    cdir.mkdir(parents=True, exist_ok=True)
    # nvcc compiles a private copy (concurrent compiles never share a file);
    # the #line directive makes its messages and line info point at the kept path
    line = str(source_path).replace("\\", "\\\\").replace('"', '\\"')
    with tempfile.TemporaryDirectory(prefix="cc2ops-nvcc-") as tmp:
        tmp_src = Path(tmp) / "kernel.cu"
        tmp_out = Path(tmp) / "kernel.cubin"
        tmp_src.write_text(f'#line 1 "{line}"\n{source}', encoding="utf-8")
        cmd = [
            nvcc,
            "-cubin",
            f"-arch={arch}",
            *BASE_FLAGS,
            *opts,
            "-o",
            str(tmp_out),
            str(tmp_src),
        ]
        _bump("nvcc_runs")
        _log.debug("running %s", " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not tmp_out.is_file():
            _atomic_write(source_path, source.encode("utf-8"))
            raise KernelCompileError(
                f"cc2ops.cuda: nvcc failed (exit {proc.returncode}) on {source_path}\n"
                f"command: {' '.join(cmd)}\n"
                f"nvcc log:\n{proc.stderr}{proc.stdout}"
            )
        data = tmp_out.read_bytes()
    _atomic_write(cubin_path, data)
    if debug:
        _atomic_write(source_path, source.encode("utf-8"))
    return data


class KernelSpec(NamedTuple):
    """One kernel build: template family, constants, extra nvcc options."""

    family: str
    consts: dict[str, Any]
    options: tuple[str, ...] = ()


def precompile(
    specs: Iterable[KernelSpec],
    *,
    arch: str | None = None,
    device: int | None = None,
    jobs: int | None = None,
) -> int:
    """Compile ``specs`` into the disk cache in parallel; returns how many ran nvcc.

    For work that will need many kernels at once (an autotuner's candidates,
    a benchmark's layers): nvcc runs in ``jobs`` parallel processes (default
    the CPU count, at most 16) instead of one after another when each kernel
    is first launched. Nothing is loaded into a context. ``arch`` defaults to
    ``device``'s (label 0 when neither is given); a machine without a GPU can
    fill a cache for another with ``arch="sm_90"``.
    """
    if arch is None:
        arch = get_device(0 if device is None else device).arch
    unique: dict[tuple, KernelSpec] = {}
    for spec in specs:
        family = _check_family(spec.family)
        consts = _check_consts(f"precompile({family})", dict(spec.consts))
        key = (family, _consts_key(consts), tuple(spec.options))
        unique.setdefault(key, KernelSpec(family, consts, tuple(spec.options)))
    if not unique:
        return 0
    before = compile_stats()["nvcc_runs"]
    sources = [
        (
            render(s.family, **s.consts),
            kernel_arch(s.family, arch, **s.consts),
            s.options,
        )
        for s in unique.values()
    ]
    workers = max(1, min(jobs or min(16, os.cpu_count() or 1), len(sources)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lambda src: compile_cubin(*src), sources))
    return compile_stats()["nvcc_runs"] - before


# --------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------

_load_lock = threading.RLock()
_modules: dict[tuple, Any] = {}
_functions: dict[tuple, Any] = {}
_functions_fast: dict[tuple, Any] = {}
#: id(module in _modules) -> its kernels' declared parameters (signature.py)
_signatures: dict[int, dict[str, Any]] = {}
_hook_registered = False


_kernel_caches: list[dict] = []


def kernel_cache() -> dict:
    """A dict for memoised launch plans that hold kernels (``Function`` objects).

    Emptied at shutdown with the loaded modules, while their contexts can
    still be activated; GPU op modules keep their per-geometry plans in one.
    """
    cache: dict = {}
    _kernel_caches.append(cache)
    return cache


def _clear_loaded() -> None:
    # unloads modules while their contexts can still be activated
    for cache in _kernel_caches:
        cache.clear()
    _functions.clear()
    _functions_fast.clear()
    _signatures.clear()
    _modules.clear()


def _consts_key(consts: dict[str, Any]) -> tuple:
    return tuple(sorted((k, type(v).__name__, v) for k, v in consts.items()))


def get_module(
    family: str, device: int, /, *, options: Sequence[str] = (), **consts: Any
) -> Any:
    """The pycuda ``Module`` of ``family`` rendered with ``consts``, for ``device``.

    Compiled for the device's own arch (or the arch-specific target the
    family's rule asks for, see :func:`kernel_arch`), loaded once per physical
    device (the context) and constants. ``options`` are extra nvcc flags (not a
    template constant).
    """
    global _hook_registered

    family = _check_family(family)
    consts = _check_consts(f"get_module({family})", consts)
    dev = get_device(device)
    key = (dev.index, family, _consts_key(consts), tuple(options))
    mod = _modules.get(key)
    if mod is not None:
        return mod
    with _load_lock:
        mod = _modules.get(key)
        if mod is not None:
            return mod
        arch = kernel_arch(family, dev.arch, **consts)
        source = render(family, **consts)
        cubin = compile_cubin(source, arch, tuple(options))
        dev.activate()
        mod = driver().module_from_buffer(cubin)
        _signatures[id(mod)] = kernel_signatures(source)
        _modules[key] = mod
        if not _hook_registered:
            register_shutdown_hook(_clear_loaded)
            _hook_registered = True
        return mod


def get_kernel(
    family: str,
    device: int,
    name: str | None = None,
    /,
    *,
    options: Sequence[str] = (),
    **consts: Any,
) -> Any:
    """The pycuda ``Function`` ``name`` (default ``consts["name"]``) of ``family``.

    ``family``, ``device`` and ``name`` are positional-only, so a template
    constant called ``name`` passed as a keyword stays a constant:
    ``get_kernel("copy", 0, name="copy_u4_d12", unit=4, maxdim=12)`` renders
    with ``name`` and fetches that kernel, while ``get_kernel("conv", 0,
    "conv_bwd", **consts)`` fetches ``conv_bwd`` from a several-kernel module.
    Memoised per (physical device, family, constants, name).
    """
    if name is None:
        name = consts.get("name")
        if not isinstance(name, str):
            raise ValueError(
                f"get_kernel({family}): give name= or a 'name' constant (the kernel "
                "templates name their __global__ functions from it)"
            )

    dev = get_device(device)
    # callers build their constants the same way every time: the constants in
    # call order are a cheap first key (the canonical sorted one is the second)
    try:
        fast = (dev.index, family, name, tuple(options), tuple(consts.items()))
        fn = _functions_fast.get(fast)
    except TypeError:  # an unhashable constant: _check_consts reports it below
        fast, fn = None, None
    if fn is not None:
        return fn
    key = (
        dev.index,
        family,
        _consts_key(_check_consts("get_kernel", consts)),
        tuple(options),
        name,
    )
    fn = _functions.get(key)
    if fn is not None:
        if fast is not None:
            _functions_fast[fast] = fn
        return fn
    mod = get_module(family, device, options=options, **consts)
    with _load_lock:
        try:
            fn = mod.get_function(name)
        except Exception as e:  # pycuda's LogicError: named symbol not found
            raise ValueError(
                f"get_kernel({family}): the compiled module has no kernel {name!r} "
                f"({e})"
            ) from e
        # what launch checks the packed arguments against (signature.py); the
        # compile test checks every registered variant declares its kernels
        params = _signatures.get(id(mod), {}).get(name)
        fn._cc2ops_name = name
        fn._cc2ops_params = params
        _functions[key] = fn
        if fast is not None:
            _functions_fast[fast] = fn
        return fn


# --------------------------------------------------------------------------
# launching
# --------------------------------------------------------------------------

_SCALAR_TYPES = (
    np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64,
    np.float32, np.float64,
)  # fmt: skip


_SCALAR_CHAR = {t: np.dtype(t).char for t in _SCALAR_TYPES}


def _dims(what: str, value: Any) -> tuple[int, int, int]:
    if type(value) is int and value >= 0:  # the common case, checked cheaply
        return (value, 1, 1)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (int(value),)
    try:
        dims = tuple(int(v) for v in value)
    except TypeError:
        raise TypeError(
            f"launch: {what} must be an int or 1-3 ints, got {value!r}"
        ) from None
    if not 1 <= len(dims) <= 3 or any(d < 0 for d in dims):
        raise ValueError(f"launch: {what} must be 1-3 ints >= 0, got {value!r}")
    return (*dims, *(1,) * (3 - len(dims)))  # type: ignore[return-value]


def _pack(args: Sequence[Any], physical: int) -> tuple[list[Any], list[type], str]:
    values: list[Any] = []
    types: list[type] = []
    for i, a in enumerate(args):
        t = type(a)
        if t in _SCALAR_CHAR:  # most arguments: checked first, by type
            values.append(a)
            types.append(t)
        elif is_gpuarray(a):
            where = device_of(a)
            if where is not None and where != physical:
                raise ValueError(
                    f"launch: argument {i} lives on physical device {where}, the "
                    f"kernel runs on {physical}"
                )
            values.append(ptr(a))
            types.append(np.uintp)
        elif isinstance(a, _SCALAR_TYPES):
            values.append(a)
            types.append(type(a))
        elif type(a).__name__ in ("DeviceAllocation", "PooledDeviceAllocation"):
            values.append(int(a))
            types.append(np.uintp)
        else:
            raise TypeError(
                f"launch: argument {i} is a {type(a).__name__}; pass GPUArrays, pycuda "
                "allocations or numpy scalars (np.int32, np.int64, np.float32, ...): "
                "a Python int or float does not say which C type the kernel expects"
            )
    fmt = "".join(_SCALAR_CHAR.get(t) or np.dtype(t).char for t in types)
    return values, types, fmt


def launch(
    fn: Any,
    grid: Any,
    block: Any,
    args: Sequence[Any],
    device: int,
    shared_mem: int = 0,
) -> None:
    """Launch ``fn`` on ``device``'s stream.

    Parameters
    ----------
    fn : pycuda Function
        From :func:`get_kernel`.
    grid, block : int or tuple of 1-3 ints
        A grid with a zero extent launches nothing.
    args : sequence
        GPUArrays (passed as their device pointer, offset included), pycuda
        allocations, or numpy scalars of the kernel's parameter types. Their
        count and types are checked against the kernel's ``extern "C"``
        signature (:mod:`cc2ops.cuda.runtime.signature`) the first time a
        kernel is launched with a given argument format: a mismatch raises
        ``TypeError`` naming the kernel, the argument and both types.
    device : int
        Device label.
    shared_mem : int
        Dynamic shared memory in bytes; above 48 KiB the kernel's opt-in limit
        is raised to it.
    """

    dev = get_device(device)
    grid3 = _dims("grid", grid)
    block3 = _dims("block", block)
    if min(block3) < 1 or block3[0] * block3[1] * block3[2] > 1024:
        raise ValueError(f"launch: block {block3} must have 1 to 1024 threads")
    if isinstance(shared_mem, bool) or not isinstance(shared_mem, (int, np.integer)):
        raise TypeError(f"launch: shared_mem must be an int, got {shared_mem!r}")
    shared_mem = int(shared_mem)
    if shared_mem < 0:
        raise ValueError(f"launch: shared_mem must be >= 0, got {shared_mem}")
    values, types, fmt = _pack(args, dev.index)
    if min(grid3) == 0:
        return
    dev.activate()
    if getattr(fn, "_cc2ops_arg_format", None) != fmt:
        # once per kernel and argument format: the packed types against the
        # argument list the kernel's source declares (a Function that did not
        # come from get_kernel has none, and is launched as packed)
        params = getattr(fn, "_cc2ops_params", None)
        if params is not None:
            check_arguments(fn._cc2ops_name, params, types)
        fn.prepare(types)
        fn._cc2ops_arg_format = fmt
    if shared_mem > 48 * 1024 and getattr(fn, "_cc2ops_dyn_smem", 0) < shared_mem:
        if shared_mem > dev.max_shared_per_block_optin:
            raise ValueError(
                f"launch: {shared_mem} bytes of shared memory exceed the device's "
                f"opt-in limit of {dev.max_shared_per_block_optin}"
            )
        attr = getattr(
            driver().function_attribute, "MAX_DYNAMIC_SHARED_SIZE_BYTES", None
        )
        if attr is None or not hasattr(fn, "set_attribute"):
            raise RuntimeError(
                f"launch: {shared_mem} bytes of dynamic shared memory need "
                "Function.set_attribute(MAX_DYNAMIC_SHARED_SIZE_BYTES), which this "
                "pycuda lacks; upgrade pycuda"
            )
        fn.set_attribute(attr, shared_mem)
        fn._cc2ops_dyn_smem = shared_mem
    fn.prepared_async_call(grid3, block3, dev.stream, *values, shared_size=shared_mem)
    if recorder() is not None:
        # the arguments _pack turned into addresses: arrays and allocations
        pointers = [i for i, a in enumerate(args) if not isinstance(a, _SCALAR_TYPES)]
        note_launch(fn, grid3, block3, shared_mem, dev.stream, values, pointers, fmt)


# --------------------------------------------------------------------------
# variants for the compile test
# --------------------------------------------------------------------------

_variant_fns: dict[str, list[Callable[[], list[dict[str, Any]]]]] = {}


def register_variants(
    family: str,
) -> Callable[[Callable[[], list[dict[str, Any]]]], Callable[[], list[dict[str, Any]]]]:
    """Decorator for ``fn() -> list of consts dicts``: ``family``'s variants.

    Every variant is rendered and compiled (``sm_90``, or the target
    :func:`kernel_arch` names for it) by the CPU test suite.
    """

    def decorate(
        fn: Callable[[], list[dict[str, Any]]],
    ) -> Callable[[], list[dict[str, Any]]]:
        fns = _variant_fns.setdefault(family, [])
        if fn not in fns:
            fns.append(fn)
        return fn

    return decorate


def all_variants() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every registered ``(family, consts)`` pair."""
    for family in sorted(_variant_fns):
        for fn in _variant_fns[family]:
            for consts in fn():
                yield family, dict(consts)
