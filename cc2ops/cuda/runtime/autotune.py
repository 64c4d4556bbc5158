"""Choosing among interchangeable GPU algorithms by timing them once.

An :class:`Autotuner` answers "which candidate runs this problem fastest?".
On the first use of a key (a JSON-able dict: op name, geometry, dtype,
precision, device name, the version of the candidate set and the candidate
names) it

1. runs the default candidate into a fresh scratch buffer: its output is the
   reference (when it is not finite, nothing is decided: the default runs and
   nothing is cached);
2. runs every other candidate into its own scratch buffer and discards those
   that raise or whose relative-norm difference from the reference exceeds
   ``tolerance`` (a wrong fast kernel must never win);
3. times the survivors with the injectable ``timer`` (default
   :func:`event_timer`: pycuda events on the device's stream held busy while
   the candidate is queued, so device time is measured, a warm-up call and
   the median of a few repetitions);
4. keeps the fastest in memory and in the JSON file
   ``<cache dir>/autotune-<device>.json`` (the cache dir is
   ``CC2OPS_CACHE_DIR``, else ``~/.cache/cc2ops/kernels``, as for cubins),
   written atomically and merged with what other processes wrote; a corrupt
   or unreadable file is ignored (and replaced on the next write).

Candidates only ever write to scratch buffers while they are tuned, so an
op's real output (an accumulator, say) is written once, by the winner, after
the choice. ``CC2OPS_AUTOTUNE=0`` makes every choice the default without
timing (deterministic runs); the variable is read at each choice.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cc2ops.cuda.runtime.tape import refuse

__all__ = [
    "AUTOTUNE_ENV",
    "Autotuner",
    "autotune_enabled",
    "event_timer",
    "key_string",
    "cache_path",
    "rel_norm_error",
]

_log = logging.getLogger(__name__)

AUTOTUNE_ENV = "CC2OPS_AUTOTUNE"
_FORMAT = 1

Timer = Callable[[Callable[[], None], int], float]


def autotune_enabled() -> bool:
    """Whether choices are timed: ``CC2OPS_AUTOTUNE`` unset or not ``0``/``off``."""
    return os.environ.get(AUTOTUNE_ENV, "1").strip().lower() not in (
        "0",
        "off",
        "false",
        "no",
    )


def key_string(key: Mapping[str, Any]) -> str:
    """The canonical JSON text of a key (sorted keys, tuples as lists)."""
    return json.dumps(key, sort_keys=True, separators=(",", ":"), default=list)


def _slug(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", str(name)).strip("-").lower()
    return s or "gpu"


def cache_path(device_name: str, directory: Path | None = None) -> Path:
    """``<directory or the cubin cache dir>/autotune-<device slug>.json``."""
    if directory is None:
        from cc2ops.cuda.runtime.compile import cache_dir

        directory = cache_dir()
    return Path(directory) / f"autotune-{_slug(device_name)}.json"


def rel_norm_error(got: np.ndarray, ref: np.ndarray) -> float:
    """``||got - ref|| / ||ref||`` in float64 (``inf`` for a shape mismatch)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        return float("inf")
    den = float(np.linalg.norm(ref))
    num = float(np.linalg.norm(got - ref))
    if den == 0.0:
        return num
    return num / den


def event_timer(
    fn: Callable[[], None], device: int, *, warmup: int = 1, reps: int = 3
) -> float:
    """Median device milliseconds of ``fn()`` on ``device``'s stream.

    :func:`cc2ops.cuda.runtime.profile.split_time`: the stream is held busy while the
    candidate queues its work, so events measure its kernels back to back,
    not the Python that launches them; candidates are ranked by what an
    asynchronous step or a CUDA graph will see.
    """
    from cc2ops.cuda.runtime.profile import split_time

    return split_time(fn, device, reps=reps, warmup=warmup).device_ms


def _read_back(out: Any) -> np.ndarray:
    if isinstance(out, np.ndarray):
        return out
    from cc2ops.cuda.runtime.array import to_host

    return to_host(out)


class Autotuner:
    """Times candidates once per key and remembers the fastest correct one.

    Parameters
    ----------
    family : str
        Names the tuner in logs (``"conv"``).
    timer : callable, optional
        ``timer(fn, device) -> milliseconds``; default :func:`event_timer`.
        Tests inject a fake.
    directory : path, optional
        Where the JSON files live; default the cubin cache directory (read
        when a file is first needed, so ``CC2OPS_CACHE_DIR`` may change
        between tuners).
    read_back : callable, optional
        ``read_back(out) -> ndarray``; default ``cc2ops.cuda.runtime.array.to_host``
        (numpy outputs pass as they are).
    """

    def __init__(
        self,
        family: str,
        *,
        timer: Timer | None = None,
        directory: Path | str | None = None,
        read_back: Callable[[Any], np.ndarray] | None = None,
    ) -> None:
        self.family = family
        self.timer: Timer = timer or event_timer
        self.directory = None if directory is None else Path(directory)
        self.read_back = read_back or _read_back
        self._lock = threading.RLock()
        self._memory: dict[str, str] = {}
        self._loaded: dict[Path, dict[str, Any]] = {}
        #: the last tuning record of each key (times, rejections), for reports
        self.records: dict[str, dict[str, Any]] = {}

    # ---- the disk cache --------------------------------------------------
    def _path(self, key: Mapping[str, Any]) -> Path:
        return cache_path(str(key.get("device", "gpu")), self.directory)

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            _log.warning("ignoring unreadable autotune cache %s: %s", path, e)
            return {}
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            return {}
        entries = doc.get("entries")
        if not isinstance(entries, dict):
            return {}
        return {
            k: v
            for k, v in entries.items()
            if isinstance(v, dict) and isinstance(v.get("choice"), str)
        }

    def _disk_entries(self, path: Path) -> dict[str, Any]:
        entries = self._loaded.get(path)
        if entries is None:
            entries = self._read(path)
            self._loaded[path] = entries
        return entries

    def _write(self, path: Path, key: str, record: dict[str, Any]) -> None:
        # merge with what other processes wrote since we read the file
        entries = self._read(path)
        entries[key] = record
        self._loaded[path] = entries
        doc = {"format": _FORMAT, "entries": entries}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(
                dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
            )
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(doc, f, indent=1, sort_keys=True)
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError as e:
            _log.warning("could not write the autotune cache %s: %s", path, e)

    def cached(self, key: Mapping[str, Any]) -> str | None:
        """The remembered choice for ``key`` (memory, then disk), else ``None``."""
        ks = key_string(key)
        with self._lock:
            hit = self._memory.get(ks)
            if hit is not None:
                return hit
            entry = self._disk_entries(self._path(key)).get(ks)
            return None if entry is None else entry["choice"]

    def forget(self) -> None:
        """Drop the in-memory choices (the files stay)."""
        with self._lock:
            self._memory.clear()
            self._loaded.clear()
            self.records.clear()

    # ---- choosing --------------------------------------------------------
    def select(
        self,
        key: Mapping[str, Any],
        candidates: Mapping[str, Callable[[Any], None]],
        *,
        default: str,
        scratch: Callable[[], Any],
        tolerance: float,
        device: int = 0,
    ) -> str:
        """The name of the candidate to run for ``key``.

        Parameters
        ----------
        key : mapping
            JSON-able; its ``"device"`` entry names the cache file.
        candidates : mapping of name to ``run(out)``
            Each writes the full result into the buffer ``out``.
        default : str
            The deterministic choice (the reference during tuning; the answer
            when tuning is off or impossible).
        scratch : callable
            Makes a fresh output buffer (one per candidate run).
        tolerance : float
            Largest relative-norm difference from the default's output.
        device : int
            Passed to the timer.
        """
        if default not in candidates:
            raise ValueError(
                f"Autotuner({self.family}): default {default!r} is not a candidate "
                f"({', '.join(candidates)})"
            )
        if len(candidates) == 1 or not autotune_enabled():
            return default
        ks = key_string(key)
        with self._lock:
            hit = self.cached(key)
            if hit is not None and hit in candidates:
                self._memory[ks] = hit
                return hit
            record = self._tune(candidates, default, scratch, tolerance, device)
            if record is None:
                return default
            self.records[ks] = record
            self._memory[ks] = record["choice"]
            self._write(self._path(key), ks, record)
            _log.info(
                "autotune %s: %s -> %s (%s)", self.family, ks, record["choice"],
                record["times_ms"],
            )  # fmt: skip
            return record["choice"]

    def _tune(
        self,
        candidates: Mapping[str, Callable[[Any], None]],
        default: str,
        scratch: Callable[[], Any],
        tolerance: float,
        device: int,
    ) -> dict[str, Any] | None:
        refuse("the autotuner timing candidates")
        ref_out = scratch()
        candidates[default](ref_out)
        ref = self.read_back(ref_out)
        if not np.all(np.isfinite(ref)):
            _log.info("autotune %s: non-finite reference, not tuning", self.family)
            return None
        times: dict[str, float] = {}
        rejected: dict[str, str] = {}
        times[default] = float(self.timer(lambda: candidates[default](ref_out), device))
        for name, run in candidates.items():
            if name == default:
                continue
            out = scratch()
            try:
                run(out)
                err = rel_norm_error(self.read_back(out), ref)
            except Exception as e:  # a failing candidate is simply not chosen
                rejected[name] = f"raised {type(e).__name__}: {e}"
                continue
            if not err <= tolerance:  # also rejects NaN
                rejected[name] = f"differs from {default} by {err:.3g}"
                continue
            try:
                times[name] = float(self.timer(lambda run=run, out=out: run(out),
                                               device))  # fmt: skip
            except Exception as e:
                rejected[name] = f"raised {type(e).__name__} while timed: {e}"
        choice = min(times, key=lambda n: (times[n], n != default))
        return {"choice": choice, "times_ms": times, "rejected": rejected}
