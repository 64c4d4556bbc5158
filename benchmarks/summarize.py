"""Regenerate BENCHMARKS.md from the newest result file of each benchmark.

Usage::

    python benchmarks/summarize.py            # writes BENCHMARKS.md at the repo root

Every file under ``benchmarks/results/`` (``<benchmark>-<gpu>-<YYYYMMDD>.json``,
one per benchmark, machine and day) is kept as performance history; a rerun on
the same day replaces the file and git keeps the earlier version. The summary
shows, per benchmark, the newest file's table with its date, GPU, the commit
it measured (the file's ``commit``) and peer; files not named so are skipped.
Text in ``benchmarks/notes/<benchmark>.md`` (what the bars are, what the next
optimisation is) is placed under each table.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from common import RESULTS_DIR, markdown_table

ROOT = Path(__file__).resolve().parent.parent
NOTES = Path(__file__).resolve().parent / "notes"
#: ``<benchmark>-<gpu>-<YYYYMMDD>.json`` (BENCHMARK_RESULTS.md); the GPU tag may
#: hold hyphens, the date is the last field.
RESULT_NAME = re.compile(r"[a-z0-9_]+-[a-z0-9-]+-[0-9]{8}\.json")
ORDER = ("conv", "layers", "step", "train", "multi_gpu", "multi_gpu_spmd", "cpu")
#: The columns shown per benchmark (every field stays in the JSON file).
COLUMNS = {
    "conv": (
        "name", "batch", "pass", "precision", "cc2ops_ms", "peer_ms", "ratio",
        "tflops", "algorithm",
    ),
    "layers": (
        "name", "pass", "cc2ops_ms", "peer_ms", "ratio", "cc2ops_gbps",
        "frac_copy_ceiling",
    ),
    "step": (
        "name", "batch", "precision", "mode", "dropout", "cc2ops_ms",
        "torch_eager_ms", "torch_graph_ms", "torch_compile_ms", "peer_best",
        "peer_ms", "ratio", "bar_ratio", "bar_limit", "bar_ok",
    ),
    "train": (
        "name", "batch", "precision", "images_per_s", "cc2ops_ms", "ratio",
        "ratio_of", "timed_steps",
    ),
    "multi_gpu": (
        "name", "gpus", "scheme", "batch", "precision", "cc2ops_ms", "peer_ms",
        "images_per_s", "speedup",
    ),
    "multi_gpu_spmd": (
        "name", "gpus", "devices", "scheme", "batch", "precision", "cc2ops_ms",
        "peer_ms", "ratio", "comm_ms", "images_per_s",
    ),
}  # fmt: skip
#: bench_step's torch peers (``<peer>_ms``, ``<peer>_error``).
STEP_PEERS = ("torch_eager", "torch_graph", "torch_compile")


def step_row_view(row: dict) -> dict:
    """A step row as the table shows it.

    A peer that failed shows ``error`` in its column (its text stays in the
    JSON file). Rows written before bench_step timed three torch peers (no
    ``mode``) had one peer, torch eager: ``peer_ms`` is shown as
    ``torch_eager_ms`` and the mode is read from the name's suffix
    (``_graph``: capture, ``_auto``: auto, else eager).
    """
    row = dict(row)
    if "mode" not in row:
        name = row.get("name", "")
        row["mode"] = (
            "capture" if name.endswith("_graph")
            else "auto" if name.endswith("_auto") else "eager"
        )  # fmt: skip
        if row.get("peer_ms") is not None:
            row.setdefault("torch_eager_ms", row["peer_ms"])
            row.setdefault("peer_best", "torch_eager")
    for peer in STEP_PEERS:
        if row.get(f"{peer}_error") and row.get(f"{peer}_ms") is None:
            row[f"{peer}_ms"] = "error"
    return row


#: Per benchmark, how a row is shown (default: as written).
ROW_VIEWS = {"step": step_row_view}
HEADER = """# Benchmarks

Measured by the scripts in `benchmarks/` (see each script's docstring), cc2ops
against PyTorch/cuDNN in the same process. Times are medians of CUDA-event timings
after warm-up; `ratio` = cc2ops_ms / peer_ms (below 1: cc2ops is faster). Every
result file is kept under `benchmarks/results/` as `<benchmark>-<gpu>-<YYYYMMDD>.json`;
this page shows the newest per benchmark, with the commit each table measured (the
file's `commit`), and is regenerated with `python benchmarks/summarize.py`. A rerun on
the same day replaces the file: earlier runs are its earlier versions in git
(`git log -p benchmarks/results/<file>`).
"""


def newest(results: Path) -> dict[str, tuple[Path, dict]]:
    """``{benchmark: (path, document)}`` of the newest file per benchmark."""
    best: dict[str, tuple[str, Path, dict]] = {}
    for path in sorted(results.glob("*.json")):
        if not RESULT_NAME.fullmatch(path.name):
            continue
        doc = json.loads(path.read_text())
        key = (doc.get("date", ""), path.name)
        name = doc["benchmark"]
        if name not in best or key > best[name][0]:
            best[name] = (key, path, doc)
    return {k: (p, d) for k, (_, p, d) in best.items()}


def render(results: Path = RESULTS_DIR) -> str:
    docs = newest(results)
    names = [n for n in ORDER if n in docs] + sorted(set(docs) - set(ORDER))
    parts = [HEADER]
    if not names:
        parts.append("\nNo results yet.\n")
    for name in names:
        path, doc = docs[name]
        parts.append(f"\n## {name}\n")
        machine = doc.get("gpu") or doc.get("cpu", "?")  # the CPU benchmark names a CPU
        parts.append(
            f"{machine}, {doc['date']}, commit `{doc['commit'][:10]}`, "
            f"peer {doc['peer']} (`{path.relative_to(ROOT)}`)\n"
        )
        view = ROW_VIEWS.get(name, dict)
        rows = [view(r) for r in doc["rows"]]
        parts.append(markdown_table(rows, COLUMNS.get(name)) + "\n")
        if doc.get("failures"):
            parts.append(
                "\nFailed configurations (not timed): "
                + "; ".join(str(f) for f in doc["failures"])
                + "\n"
            )
        note = NOTES / f"{name}.md"
        if note.exists():
            parts.append("\n" + note.read_text().strip() + "\n")
    return "\n".join(parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=RESULTS_DIR)
    p.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = p.parse_args()
    args.out.write_text(render(args.results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
