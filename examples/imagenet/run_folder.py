"""The ``--out`` folder of a training run: which run it holds, and its logs.

One folder holds one run. A run's files are its checkpoints
(``ckpt-*.npz``), ``metrics.csv``, ``metrics.jsonl`` and ``curves.png``.
:func:`plan_run_folder` decides, before anything is trained or written,
what a new run may do with its ``--out``:

- a folder that is missing or holds none of those files is used as it is;
- a new run (no ``--resume``) whose settings are those of the finished run that
  the folder holds has nothing to do (:func:`finished_run`): the same
  command can be run twice, and the second time changes nothing;
- ``--resume`` continues the run that the folder holds: the checkpoint's
  ``run_id`` is the one of every checkpoint there (a checkpoint without a
  ``run_id``, from before there were any, counts as the folder's own when it
  lies in that folder), and no checkpoint there is further on than the
  resumed one; log records after the resumed step are dropped (they belong
  to the interrupted attempt, which is redone);
- anything else is another run, and is refused with :class:`RunFolderError`,
  unless ``--overwrite`` is given: the old run's folder is then renamed to
  ``<out>.old-N`` (the first free N) and a new, empty ``<out>`` is made. Nothing
  is ever deleted: the old run stays whole beside the new one.

So a second run can neither prune the first run's checkpoints (or the other
way round) nor append to its logs or its plot.

Writes are whole or not at all: a log record is one ``write`` of a complete
line, and a failed or short write (a full disk) is cut back off the file, so
no torn line is left; files rewritten in full go through a temporary file,
``fsync`` and ``os.replace``. Reading tolerates a torn line that an older
version or a killed process left (it is dropped with a warning), so a full
disk can never make ``--resume`` fail on the log.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import checkpoint as ckpt_mod

LOG_FILES = ("metrics.csv", "metrics.jsonl", "curves.png")
CHECKPOINT_GLOB = "ckpt-*" + ckpt_mod.SUFFIX


class RunFolderError(RuntimeError):
    """``--out`` holds another run, or a file of the run cannot be written."""


# --------------------------------------------------------------------------
# which run a folder holds
# --------------------------------------------------------------------------


def run_files(out: str | os.PathLike) -> list[Path]:
    """The files of a training run in ``out`` (checkpoints first), sorted."""
    out = Path(out)
    if not out.is_dir():
        return []
    ckpts = sorted(p for p in out.glob(CHECKPOINT_GLOB) if p.is_file())
    return ckpts + [out / n for n in LOG_FILES if (out / n).is_file()]


@dataclass(frozen=True)
class FolderPlan:
    """What a run does with its ``--out`` (see :func:`plan_run_folder`).

    Attributes
    ----------
    out : Path
    action : {"new", "continue", "replace"}
        Use the (missing or run-free) folder; continue the run it holds; move
        the run it holds aside to ``aside`` and start in an empty folder.
    aside : Path or None
        Where ``"replace"`` moves the old run.
    reason : str
        Why the folder holds another run (``"replace"`` only).
    """

    out: Path
    action: str
    aside: Path | None = None
    reason: str = ""


def _same_run(header: dict[str, Any], resume: Any, out: Path) -> bool:
    mine, theirs = resume.header.get("run_id"), header.get("run_id")
    if mine and theirs:
        return mine == theirs
    # checkpoints written before run ids: the folder's own checkpoint only
    return Path(resume.path).resolve().parent == out.resolve()


def _conflict(out: Path, files: list[Path], resume: Any | None) -> str | None:
    """Why ``out`` holds another run than ``resume`` continues, or None."""
    shown = ", ".join(p.name for p in files[:3]) + (" ..." if len(files) > 3 else "")
    if resume is None:
        return f"--out {out} already holds a run ({shown})"
    step = int(resume.header.get("step", 0))
    ckpts = ckpt_mod.list_checkpoints(out)
    if not ckpts:
        return (
            f"--out {out} holds files of a run ({shown}) but no checkpoint of the "
            f"run that {resume.path} continues"
        )
    for _, p in ckpts:
        if not _same_run(ckpt_mod.read_header(p), resume, out):
            return (
                f"--out {out} holds another run: {p.name} is not from the run of "
                f"{resume.path}"
            )
    for s, p in reversed(ckpts):
        if s <= step:
            break
        try:
            ckpt_mod.load_checkpoint(p)
        except ckpt_mod.CheckpointError:
            continue  # a corrupt one that --resume passed over, with a warning
        return (
            f"--out {out} holds checkpoints after the resumed one ({p.name} at "
            f"step {s}, resumed: step {step}); continuing there would mix the "
            "two runs"
        )
    return None


def finished_run(
    out: str | os.PathLike, config: dict[str, Any], epochs: int
) -> Path | None:
    """The newest checkpoint of ``out`` when it ends a run with ``config``.

    That is: it is an end-of-epoch checkpoint, at least ``epochs`` epochs
    are done, and its saved settings equal ``config`` (compared as JSON).
    Otherwise None.
    """
    out = Path(out)
    if not out.is_dir():
        return None
    ckpts = ckpt_mod.list_checkpoints(out)
    if not ckpts:
        return None
    header = ckpt_mod.read_header(ckpts[-1][1])
    same = header.get("config") == json.loads(json.dumps(config))
    done = header.get("step_in_epoch") == 0 and int(header.get("epoch", 0)) >= epochs
    return ckpts[-1][1] if same and done else None


def _aside_name(out: Path) -> Path:
    n = 1
    while out.with_name(f"{out.name}.old-{n}").exists():
        n += 1
    return out.with_name(f"{out.name}.old-{n}")


def plan_run_folder(
    out: str | os.PathLike, resume: Any | None = None, overwrite: bool = False
) -> FolderPlan:
    """Decide what the run does with ``out``; nothing is changed yet.

    Parameters
    ----------
    out : path
        The ``--out`` folder.
    resume : checkpoint.Checkpoint, optional
        The checkpoint that ``--resume`` loaded.
    overwrite : bool
        ``--overwrite``: move another run aside instead of refusing.

    Raises
    ------
    RunFolderError
        ``out`` is a file, or it holds another run and ``overwrite`` is false
        (the message says what to do).
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"--out {out} is a file, not a folder")
    files = run_files(out)
    if not files:
        return FolderPlan(out, "new")
    why = _conflict(out, files, resume)
    if why is None:
        return FolderPlan(out, "continue")
    aside = _aside_name(out)
    if not overwrite:
        cont = (
            f"--resume {out} to continue it"
            if resume is None and ckpt_mod.list_checkpoints(out)
            else None
        )
        options = [cont, "another --out", f"--overwrite to move it aside to {aside}"]
        raise RunFolderError(
            f"{why}; nothing was changed. Give "
            + ", or ".join(o for o in options if o)
            + " (nothing is deleted)"
        )
    return FolderPlan(out, "replace", aside, why)


def apply_run_folder(plan: FolderPlan, say: Callable[[str], None]) -> None:
    """Make the folder of ``plan``; for ``"replace"``, rename the old one first."""
    if plan.action == "replace":
        try:
            os.rename(plan.out, plan.aside)
        except OSError as e:
            raise RunFolderError(
                f"--overwrite: cannot move {plan.out} aside to {plan.aside}: {e}"
            ) from e
        say(f"{plan.reason}: moved it to {plan.aside} (--overwrite)")
    try:
        plan.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunFolderError(f"cannot make --out {plan.out}: {e}") from e


# --------------------------------------------------------------------------
# whole writes
# --------------------------------------------------------------------------


def _write(fd: int, data: bytes) -> int:
    # the only place that appends bytes; tests replace it to fill the disk
    return os.write(fd, data)


def append_whole(path: Path, text: str) -> None:
    """Append ``text`` (complete lines) to ``path`` in one write, or not at all.

    A failed or short write (``ENOSPC``) is truncated off again, so the file
    never ends in a torn line.

    Raises
    ------
    RunFolderError
        The write failed (the file is as it was).
    """
    data = text.encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as e:
        raise RunFolderError(f"cannot write {path}: {e}") from e
    try:
        start = os.fstat(fd).st_size
        try:
            n = _write(fd, data)
            if n != len(data):
                raise OSError(f"short write, {n} of {len(data)} bytes written")
        except OSError as e:
            try:
                os.ftruncate(fd, start)  # shrinking needs no free space
            except OSError:
                pass
            raise RunFolderError(f"cannot write {path}: {e}") from e
    finally:
        os.close(fd)


def atomic_replace(path: Path, write: Callable[[Path], None]) -> Path:
    """Write ``path`` through ``write(tmp)``, a temporary file, fsync, rename.

    On any failure the temporary file is removed and ``path`` is unchanged.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path``'s text whole (see :func:`atomic_replace`).

    Raises
    ------
    RunFolderError
        The write failed (the file is as it was).
    """
    try:
        atomic_replace(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    except OSError as e:
        raise RunFolderError(f"cannot write {path}: {e}") from e


# --------------------------------------------------------------------------
# the logs
# --------------------------------------------------------------------------


class MetricsLog:
    """``metrics.jsonl`` (step and epoch records) and ``metrics.csv`` (epochs).

    Parameters
    ----------
    folder : Path
    fields : sequence of str
        The CSV columns.
    warn : callable
        ``warn(message)`` for records that cannot be read back (torn lines).
    """

    def __init__(
        self, folder: Path, fields: Sequence[str], warn: Callable[[str], None]
    ) -> None:
        self.jsonl = folder / "metrics.jsonl"
        self.csv = folder / "metrics.csv"
        self.fields = tuple(fields)
        self.warn = warn

    def record(self, rec: dict[str, Any]) -> None:
        append_whole(self.jsonl, json.dumps(rec) + "\n")

    def epoch(self, rec: dict[str, Any]) -> None:
        self.record({"kind": "epoch", **rec})
        buf = io.StringIO()
        w = csv.DictWriter(
            buf, fieldnames=self.fields, extrasaction="ignore", lineterminator="\n"
        )
        if not self.csv.exists() or self.csv.stat().st_size == 0:
            w.writeheader()
        w.writerow(rec)
        append_whole(self.csv, buf.getvalue())

    def read(self) -> list[dict[str, Any]]:
        """The records of ``metrics.jsonl``; unreadable lines are dropped, warned."""
        if not self.jsonl.exists():
            return []
        records = []
        with open(self.jsonl, encoding="utf-8", errors="replace") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    int(rec["step"])
                except (ValueError, TypeError, KeyError) as e:
                    cut = "" if line.endswith("\n") else " (a torn last line)"
                    self.warn(
                        f"warning: {self.jsonl} line {i}{cut} is not a whole "
                        f"record ({type(e).__name__}); dropped it"
                    )
                    continue
                records.append(rec)
        return records

    def _csv_rows(self) -> list[dict[str, str]]:
        rows = []
        with open(self.csv, newline="", encoding="utf-8", errors="replace") as f:
            for i, r in enumerate(csv.DictReader(f), 2):
                try:
                    int(r["step"])
                    if None in r or None in r.values():
                        raise ValueError("wrong number of columns")
                except (ValueError, TypeError, KeyError) as e:
                    self.warn(
                        f"warning: {self.csv} row {i} is not a whole row "
                        f"({type(e).__name__}); dropped it"
                    )
                    continue
                rows.append(r)
        return rows

    def truncate(self, step: int) -> None:
        """Keep the records of steps up to ``step`` only, each whole."""
        self.copy_until(step, self)

    def copy_until(self, step: int, dest: MetricsLog) -> None:
        """Write this log's records of steps up to ``step`` to ``dest``'s files."""
        if self.jsonl.exists():
            keep = [r for r in self.read() if int(r["step"]) <= step]
            atomic_write_text(dest.jsonl, "".join(json.dumps(r) + "\n" for r in keep))
        if self.csv.exists():
            rows = [r for r in self._csv_rows() if int(r["step"]) <= step]
            buf = io.StringIO()
            w = csv.DictWriter(
                buf, fieldnames=dest.fields, extrasaction="ignore", lineterminator="\n"
            )
            w.writeheader()
            w.writerows(rows)
            atomic_write_text(dest.csv, buf.getvalue())
