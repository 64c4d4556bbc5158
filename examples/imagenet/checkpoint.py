"""Training checkpoints of the cc2ops ImageNet example: one ``.npz`` file each.

A checkpoint is an uncompressed ``.npz`` (numpy's zip of ``.npy`` files)
holding

``header``
    uint8 bytes of a JSON object: ``format`` and ``version``, the network
    (name, width, classes, input size, layer-spec hash), the class names,
    ``epoch`` (epochs completed), ``step_in_epoch`` (batches done in the
    current epoch), ``step`` (batches done in all), the per-channel
    normalisation, the RNG states, the learning-rate schedule and the run's
    settings;
``param/<name>``, ``mom/<name>``
    every parameter and its momentum, float32;
``state/<name>``
    extra state arrays (the ``cc2ops.dropout_state`` values).

Writes are atomic: the file is written under a temporary name (a dot file in
the same folder, so ``os.replace`` never crosses file systems), flushed and
``fsync``-ed, renamed over the final name, and the folder is ``fsync``-ed.
A crash or ``SIGKILL`` at any point leaves either the old file or the new
one, never a partial file under the final name; a leftover temporary file
is ignored by :func:`find_latest` and removed by the next save. A failed
write (a full disk) removes its temporary file and leaves the previous
checkpoint as it was.

Reading checks everything: the zip structure, the header, and the CRC-32 of
every array (:func:`load_checkpoint` reads them all). Given a folder,
:func:`load_checkpoint` takes the newest checkpoint that passes, and reports
each newer one it had to pass over, by name and reason, through its ``warn``
callback.
"""

from __future__ import annotations

import json
import os
import time
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

FORMAT = "cc2ops-imagenet-example-checkpoint"
VERSION = 1
SUFFIX = ".npz"
_TMP_MARK = ".tmp-"
#: The first bytes of every zip (and so ``.npz``) file.
_ZIP_MAGIC = b"PK\x03\x04"


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable or for another network."""


@dataclass
class Checkpoint:
    """A loaded checkpoint.

    Attributes
    ----------
    path : Path
    header : dict
        The JSON header (see the module docstring).
    params, momenta : dict of str -> ndarray
    states : dict of str -> ndarray
        Extra state arrays (may be empty).
    """

    path: Path
    header: dict[str, Any]
    params: dict[str, np.ndarray]
    momenta: dict[str, np.ndarray]
    states: dict[str, np.ndarray] = field(default_factory=dict)


def _write_npz(f: BinaryIO, header: dict, arrays: dict[str, np.ndarray]) -> None:
    # the only place that writes bytes; tests replace it to fail mid-write
    np.savez(f, **arrays, header=np.frombuffer(json.dumps(header).encode(), np.uint8))


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open folders; rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(
    path: str | os.PathLike,
    header: dict[str, Any],
    params: dict[str, np.ndarray],
    momenta: dict[str, np.ndarray],
    states: dict[str, np.ndarray] | None = None,
) -> Path:
    """Write a checkpoint atomically (temporary file, fsync, rename).

    Parameters
    ----------
    path : path
        Final file name (``.npz``); its folder is created if needed.
    header : dict
        JSON-able; ``format`` and ``version`` are added.
    params, momenta : dict of str -> ndarray
        Same keys.
    states : dict of str -> ndarray, optional
        Extra state arrays, stored as ``state/<name>``.

    Returns
    -------
    Path
        ``path``.
    """
    path = Path(path)
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    if set(params) != set(momenta):
        raise ValueError("save_checkpoint: params and momenta must have the same keys")
    arrays = {f"param/{k}": np.asarray(v) for k, v in params.items()}
    arrays.update({f"mom/{k}": np.asarray(v) for k, v in momenta.items()})
    arrays.update({f"state/{k}": np.asarray(v) for k, v in (states or {}).items()})
    header = {"format": FORMAT, "version": VERSION, "saved_at": time.time(), **header}
    remove_stale_temporaries(folder)
    tmp = folder / f".{path.name}{_TMP_MARK}{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            _write_npz(f, header, arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(folder)
    return path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists but belongs to someone else, or cannot tell
    return True


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Delete temporary files that killed writers left in ``folder``.

    A temporary file is named ``.<final name>.tmp-<pid>``; it is stale when
    no process ``<pid>`` runs any more (or it is this process's own).
    """
    removed = []
    for p in Path(folder).glob(f".*{SUFFIX}{_TMP_MARK}*"):
        pid_text = p.name.rpartition(_TMP_MARK)[2]
        if not pid_text.isdigit():
            continue
        pid = int(pid_text)
        if pid == os.getpid() or not _pid_alive(pid):
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def _not_ours(path: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"{path} is not a cc2ops checkpoint ({why}); give --resume a "
        f"ckpt-*{SUFFIX} file written by train.py, or the folder holding them"
    )


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON header of a checkpoint file (reads nothing else).

    Raises
    ------
    CheckpointError
        Missing file, not a zip/npz, no header, or another format.
    """
    path = Path(path)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise CheckpointError(f"checkpoint {path} {what}")
    try:
        with open(path, "rb") as f:
            magic = f.read(len(_ZIP_MAGIC))
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from e
    if magic != _ZIP_MAGIC:
        # np.load would try it as a pickle and suggest allow_pickle=True
        what = "an empty file" if not magic else "not an .npz (zip) file"
        raise _not_ours(path, f"it is {what}")
    try:
        with np.load(path, allow_pickle=False) as z:
            if "header" not in z.files:
                raise _not_ours(path, "an .npz file without a header entry")
            header = json.loads(z["header"].tobytes().decode())
    except CheckpointError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise CheckpointError(
            f"{path} is not a readable checkpoint ({type(e).__name__}: {e})"
        ) from e
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        got = header.get("format") if isinstance(header, dict) else None
        raise _not_ours(path, f"format {got!r}, expected {FORMAT!r}")
    if header.get("version") != VERSION:
        raise CheckpointError(
            f"{path} has checkpoint version {header.get('version')}, this script "
            f"reads version {VERSION}"
        )
    return header


def _load_file(path: Path) -> Checkpoint:
    """Read one checkpoint file whole; every array's CRC-32 is checked."""
    header = read_header(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            # reading each member to its end makes zipfile check its CRC-32
            params = {k[6:]: z[k] for k in z.files if k.startswith("param/")}
            momenta = {k[4:]: z[k] for k in z.files if k.startswith("mom/")}
            states = {k[6:]: z[k] for k in z.files if k.startswith("state/")}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointError(
            f"{path} is not a readable checkpoint ({type(e).__name__}: {e})"
        ) from e
    if set(params) != set(momenta) or not params:
        raise CheckpointError(f"{path} lacks parameters or momenta")
    return Checkpoint(path, header, params, momenta, states)


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def load_checkpoint(
    path: str | os.PathLike, warn: Callable[[str], None] | None = None
) -> Checkpoint:
    """Load a checkpoint file, or the newest intact checkpoint in a folder.

    Parameters
    ----------
    path : path
        A checkpoint file, or a folder of them.
    warn : callable, optional
        ``warn(message)`` for each checkpoint of the folder that is passed
        over because it cannot be read (torn file, failed CRC-32, another
        format); default :func:`warnings.warn`.

    Raises
    ------
    CheckpointError
        Nothing loadable at ``path`` (the message says why).
    """
    path = Path(path)
    if not path.is_dir():
        return _load_file(path)
    warn = warn or _warn
    readable, broken = _scan(path)
    for _, why in broken:
        warn(f"skipping an unreadable checkpoint: {why}")
    for i in range(len(readable) - 1, -1, -1):
        try:
            return _load_file(readable[i][1])
        except CheckpointError as e:
            then = "falling back to the next older one" if i else "none older is left"
            warn(f"skipping a corrupt checkpoint: {e}; {then}")
    raise CheckpointError(f"no readable checkpoint (*{SUFFIX}) in {path}")


def _scan(folder: Path) -> tuple[list[tuple[int, Path]], list[tuple[Path, str]]]:
    """``(step, path)`` of the checkpoints whose header reads, oldest first, and
    ``(path, reason)`` of the other ``*.npz`` files (temporaries left out)."""
    found, broken = [], []
    for p in sorted(Path(folder).glob(f"*{SUFFIX}")):
        if p.name.startswith(".") or _TMP_MARK in p.name:
            continue
        try:
            header = read_header(p)
        except CheckpointError as e:
            broken.append((p, str(e)))
            continue
        found.append((int(header.get("step", 0)), p))
    return sorted(found, key=lambda sp: (sp[0], sp[1].name)), broken


def list_checkpoints(folder: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, path)`` of every readable checkpoint in ``folder``, oldest first.

    Temporary files of interrupted writes and unreadable files are left out.
    """
    return _scan(Path(folder))[0]


def find_latest(folder: str | os.PathLike) -> Path:
    """The checkpoint with the most training steps in ``folder`` whose header reads."""
    found = list_checkpoints(folder)
    if not found:
        raise CheckpointError(f"no readable checkpoint (*{SUFFIX}) in {folder}")
    return found[-1][1]


def prune(
    folder: str | os.PathLike, keep: int, current: str | os.PathLike | None = None
) -> list[Path]:
    """Delete all but the ``keep`` newest checkpoints (``keep=0``: keep all).

    ``current`` (the checkpoint just written) is never deleted, whatever the
    steps of the others; unreadable files are never deleted either.
    """
    if keep <= 0:
        return []
    current = Path(current).resolve() if current is not None else None
    old = [
        p
        for _, p in list_checkpoints(folder)[:-keep]
        if current is None or p.resolve() != current
    ]
    for p in old:
        p.unlink(missing_ok=True)
    return old


def check_network(
    ckpt: Checkpoint,
    spec_hash: str,
    describe: dict[str, Any],
    param_shapes: dict[str, tuple[int, ...]],
) -> None:
    """Raise :class:`CheckpointError` unless ``ckpt`` holds this network's parameters.

    Parameters
    ----------
    spec_hash : str
        :meth:`Network.spec_hash` of the network being built.
    describe : dict
        Name, width, classes and input of that network, for the message.
    param_shapes : dict
        Expected parameter shapes.
    """
    net = ckpt.header.get("net", {})

    def show(d: dict) -> str:
        inp = d.get("input") or [None, d.get("crop"), d.get("crop")]
        return (
            f"{d.get('name')!r} (width-mult {d.get('width_mult')}, "
            f"{d.get('n_classes')} classes, {inp[1]}x{inp[2]} input, spec "
            f"{d.get('spec_hash')})"
        )

    if net.get("spec_hash") != spec_hash:
        raise CheckpointError(
            f"checkpoint {ckpt.path} is from another network: it holds {show(net)}, "
            f"this run builds {show({**describe, 'spec_hash': spec_hash})}"
        )
    for name, shape in param_shapes.items():
        got = ckpt.params.get(name)
        if got is None or tuple(got.shape) != tuple(shape):
            raise CheckpointError(
                f"checkpoint {ckpt.path}: parameter {name} has shape "
                f"{None if got is None else tuple(got.shape)}, expected {tuple(shape)}"
            )
