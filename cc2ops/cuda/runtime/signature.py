"""The argument lists kernels declare, read from their rendered CUDA source.

Every kernel template declares its parameters once, in its ``extern "C"
__global__`` signature. :func:`kernel_signatures` reads them from the rendered
source (after Mako, so every ``${T}`` is a concrete type; ``typedef`` names of
the preamble are resolved), and :func:`check_arguments` compares the types
:func:`cc2ops.cuda.runtime.compile.launch` packed against them: a call site
that passes an ``np.int64`` where the kernel takes ``unsigned int`` would
otherwise have the kernel misread the argument buffer, silently. pycuda's
``prepare`` argument strings state the same thing by hand; here the kernel
source is the one statement.

Pure Python, no CUDA: the CPU test suite checks every registered kernel
variant's signature parses.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Param", "kernel_signatures", "check_arguments"]

#: Scalar C types by name -> (numpy kind, bytes). Pointers are kind "p".
_C_SCALARS: dict[str, tuple[str, int]] = {
    "float": ("f", 4),
    "double": ("f", 8),
    "char": ("i", 1),
    "signed char": ("i", 1),
    "unsigned char": ("u", 1),
    "short": ("i", 2),
    "unsigned short": ("u", 2),
    "int": ("i", 4),
    "signed int": ("i", 4),
    "unsigned": ("u", 4),
    "unsigned int": ("u", 4),
    "long long": ("i", 8),
    "long long int": ("i", 8),
    "unsigned long long": ("u", 8),
    "unsigned long long int": ("u", 8),
    "int8_t": ("i", 1),
    "uint8_t": ("u", 1),
    "int16_t": ("i", 2),
    "uint16_t": ("u", 2),
    "int32_t": ("i", 4),
    "uint32_t": ("u", 4),
    "int64_t": ("i", 8),
    "uint64_t": ("u", 8),
    "size_t": ("u", 8),
    "ptrdiff_t": ("i", 8),
    "intptr_t": ("i", 8),
    "uintptr_t": ("u", 8),
}

_QUALIFIERS = {"const", "volatile", "__restrict__", "restrict", "__restrict"}

_KERNEL = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+'
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(?P<name>[A-Za-z_]\w*)\s*\("
)
_TYPEDEF = re.compile(r"\btypedef\s+([^;{}()]+?)\s+([A-Za-z_]\w*)\s*;")
_USING = re.compile(r"\busing\s+([A-Za-z_]\w*)\s*=\s*([^;{}()]+?)\s*;")


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its C declaration, name, and (kind, bytes).

    ``kind`` is ``"p"`` for a pointer, a numpy kind (``"f"``, ``"i"``, ``"u"``)
    for a scalar, or ``None`` when the type is not a known scalar (a struct
    passed by value): such a parameter is not checked.
    """

    decl: str
    name: str
    kind: str | None
    size: int

    @property
    def c_type(self) -> str:
        return self.decl[: len(self.decl) - len(self.name)].strip() or self.decl


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    return re.sub(r"//[^\n]*", " ", source)


def _aliases(source: str) -> dict[str, str]:
    table = {new: old for old, new in _TYPEDEF.findall(source)}
    table.update(dict(_USING.findall(source)))
    return table


def _resolve(words: list[str], aliases: dict[str, str]) -> str:
    text = " ".join(w for w in words if w not in _QUALIFIERS)
    for _ in range(8):  # typedef chains (T -> float32 -> float)
        if text in _C_SCALARS or text not in aliases:
            break
        text = " ".join(
            w for w in aliases[text].replace("*", " * ").split() if w not in _QUALIFIERS
        )
    return text


def _param(decl: str, aliases: dict[str, str]) -> Param:
    decl = " ".join(decl.split())
    spaced = decl.replace("*", " * ").replace("&", " & ")
    words = spaced.split()
    name = words[-1]
    type_words = words[:-1]
    if "*" in type_words:
        return Param(decl, name, "p", 8)
    base = _resolve(type_words, aliases)
    if "*" in base.split():  # a typedef of a pointer type
        return Param(decl, name, "p", 8)
    kind, size = _C_SCALARS.get(base, (None, 0))
    return Param(decl, name, kind, size)


def _split_params(text: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    return [p.strip() for p in out if p.strip() and p.strip() != "void"]


def kernel_signatures(source: str) -> dict[str, tuple[Param, ...]]:
    """``{kernel name: its parameters}`` of every ``extern "C" __global__``
    kernel in the rendered CUDA ``source`` (declarations and definitions)."""
    source = _strip_comments(source)
    aliases = _aliases(source)
    out: dict[str, tuple[Param, ...]] = {}
    for m in _KERNEL.finditer(source):
        depth, i = 1, m.end()
        while depth and i < len(source):
            if source[i] == "(":
                depth += 1
            elif source[i] == ")":
                depth -= 1
            i += 1
        params = _split_params(source[m.end() : i - 1])
        out[m.group("name")] = tuple(_param(p, aliases) for p in params)
    return out


def _packed(t: type) -> tuple[str, int]:
    """(kind, bytes) of a packed argument type. A device pointer is packed as
    ``np.uintp``, which is ``np.uint64`` on the 64-bit platforms CUDA runs on:
    the two cannot be told apart, hence the rule in :func:`_compatible`."""
    dt = np.dtype(t)
    return (dt.kind, dt.itemsize)


def _compatible(param: Param, packed: tuple[str, int]) -> bool:
    if param.kind is None:
        return True
    want = (param.kind, param.size)
    if want == packed:
        return True
    # what the kernel reads is the right number of bytes of the right class:
    # integers of either signedness of the same width (the value is the same
    # for every index a kernel takes), and a device address as a 64-bit
    # unsigned integer or back
    integer = {"i", "u"}
    if want[0] in integer and packed[0] in integer and want[1] == packed[1]:
        return True
    return {want, packed} == {("p", 8), ("u", 8)}


def check_arguments(
    kernel: str, params: Sequence[Param], types: Sequence[type]
) -> None:
    """Raise ``TypeError`` unless ``types`` (what launch packed) fit ``params``.

    A scalar must have the parameter's class (floating point, integer,
    pointer) and width; integers may differ in signedness, and a device
    address may be a ``uint64``. The message names the kernel, the argument
    (position and name) and both types, e.g. ``"launch: kernel fill_u1
    argument 1 (n) is index_t in the kernel, got uint32"``.
    """
    if len(types) != len(params):
        names = ", ".join(p.name for p in params)
        raise TypeError(
            f"launch: kernel {kernel} takes {len(params)} arguments ({names}), got "
            f"{len(types)}"
        )
    for i, (param, t) in enumerate(zip(params, types, strict=True)):
        packed = _packed(t)
        if not _compatible(param, packed):
            got = np.dtype(t).name
            raise TypeError(
                f"launch: kernel {kernel} argument {i} ({param.name}) is "
                f"{param.c_type} in the kernel, got {got}"
            )
