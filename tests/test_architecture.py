"""The layering of the package, checked: every dependency points down.

``lint-imports`` checks the import contracts of ``pyproject.toml`` statically
(the frontend never imports ``cc2ops.cuda``, the CUDA runtime needs neither
PyTensor nor the graph core, layers inside ``cc2ops.cuda`` only import
downward, the core never imports ``cc2ops.backends``); the other tests check
what a fresh interpreter actually loads.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _loaded_after(statement: str) -> list[str]:
    proc = _run(
        f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_contracts():
    lint = Path(sys.executable).with_name("lint-imports")
    cmd = [str(lint)] if lint.exists() else [sys.executable, "-m", "importlinter.cli"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p
    )
    proc = subprocess.run(
        [*cmd, "--no-cache"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"Contracts: [1-9][0-9]* kept, 0 broken", proc.stdout), proc.stdout


def test_import_cc2ops_loads_no_backend():
    loaded = _loaded_after("import cc2ops")
    assert "cc2ops" in loaded and "cc2ops.conv" in loaded
    cuda = [m for m in loaded if m == "cc2ops.cuda" or m.startswith("cc2ops.cuda.")]
    assert cuda == [], f"import cc2ops loaded {cuda}"
    heavy = [
        m
        for m in loaded
        if m.split(".")[0] in ("numba", "jax", "jaxlib", "torch", "pycuda", "mlx")
    ]
    assert heavy == [], f"import cc2ops loaded {heavy}"


def test_import_cc2ops_testing_loads_no_backend():
    """The nets and compare helpers of tests and benchmarks need no GPU backend
    until a GPU variable is asked for (then through the seam)."""
    loaded = _loaded_after("import cc2ops.testing")
    assert "cc2ops.testing.nets" in loaded and "cc2ops.testing.compare" in loaded
    cuda = [m for m in loaded if m == "cc2ops.cuda" or m.startswith("cc2ops.cuda.")]
    assert cuda == [], f"import cc2ops.testing loaded {cuda}"


def test_tests_take_the_nets_from_cc2ops_testing_not_benchmarks():
    """One net definition: the tests import the nets (and compare helpers) from
    cc2ops.testing, never from benchmarks/ through a sys.path edit."""
    pattern = re.compile(r"^\s*(from|import)\s+benchmarks\b", re.M)
    offenders = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "tests").rglob("*.py"))
        if pattern.search(p.read_text())
    ]
    assert offenders == [], f"tests importing benchmarks/: {offenders}"


def test_gpu_step_of_the_net_table_goes_through_the_seam():
    proc = _run(
        "import sys\n"
        "from cc2ops import seam\n"
        "from cc2ops.testing.nets import StepConfig, build_step\n"
        "cfg = StepConfig('cifar18', batch=2, width_mult=0.25)\n"
        "assert seam.registered() is None\n"
        "step = build_step(cfg, gpu_params=True, gpu_inputs=True, gpu_outputs=True)\n"
        "assert seam.registered().name == 'cc2ops.cuda'\n"
        "print(step.inputs[0].type, step.params['conv1.W'].type)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "CudaArrayType(float32, shape=(2, 3, 32, 32), device=0)" in proc.stdout


def test_gpu_dropout_state_goes_through_the_seam():
    """A GPU dropout state in a program that never imported cc2ops.cuda: the
    seam imports the backend by name, which registers itself (no CUDA used)."""
    proc = _run(
        "import sys\n"
        "import cc2ops\n"
        "from cc2ops import seam\n"
        "assert seam.registered() is None\n"
        "state = cc2ops.dropout_state(3, device=1)\n"
        "assert 'cc2ops.cuda' in sys.modules\n"
        "assert seam.registered().name == 'cc2ops.cuda'\n"
        "assert seam.is_gpu_variable(state)\n"
        "print(state.type)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "CudaArrayType(uint32, shape=(4,), device=1)" in proc.stdout


@pytest.mark.parametrize(
    "old, new",
    [
        ("cc2ops.cuda.device", "cc2ops.cuda.runtime.device"),
        ("cc2ops.cuda.conv", "cc2ops.cuda.ops.conv.ops"),
        ("cc2ops.cuda.blas", "cc2ops.cuda.libs.cublas"),
        ("cc2ops.cuda.blas_ops", "cc2ops.cuda.ops.tensor.blas"),
        ("cc2ops.cuda.graphs", "cc2ops.cuda.capture"),
        ("cc2ops.graph.lift", "cc2ops.cuda.rewriting.lift"),
        # the family renames: one name per family at every layer
        ("cc2ops.response_norm", "cc2ops.cross_map_norm"),
        ("cc2ops.softmax_loss", "cc2ops.softmax_cross_entropy"),
        ("cc2ops.cuda.ops.response_norm", "cc2ops.cuda.ops.cross_map_norm"),
        ("cc2ops.cuda.ops.softmax_loss", "cc2ops.cuda.ops.softmax_cross_entropy"),
        ("cc2ops.cuda.response_norm", "cc2ops.cuda.ops.cross_map_norm"),
        ("cc2ops.cuda.softmax_loss", "cc2ops.cuda.ops.softmax_cross_entropy"),
        ("cc2ops.graph.db", "cc2ops.rewriting.db"),
        ("cc2ops.graph.fuse_softmax_loss", "cc2ops.rewriting.fuse_softmax_loss"),
        ("cc2ops.graph.multi_gpu", "cc2ops.distributed.hybrid"),
        ("cc2ops.comm", "cc2ops.distributed.collectives"),
        ("cc2ops.cuda.comm", "cc2ops.cuda.ops.comm"),
    ],
)
def test_old_module_paths_warn_and_alias(old, new):
    package, name = old.rsplit(".", 1)
    proc = _run(
        "import importlib, warnings\n"
        # the package may be an old path itself (cc2ops.graph): it warns apart
        "with warnings.catch_warnings():\n"
        "    warnings.simplefilter('ignore', DeprecationWarning)\n"
        f"    import {package}\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n"
        f"    importlib.import_module({old!r})\n"
        "except DeprecationWarning as e:\n"
        "    print('warned:', e)\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        f"import {old} as via_import\n"
        f"from {package} import {name} as via_from\n"
        f"new = importlib.import_module({new!r})\n"
        "assert via_import is new and via_from is new\n"
        f"assert new.__spec__.name == {new!r}\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert f"warned: {old} moved to {new}" in proc.stdout


def test_renamed_families_give_the_same_objects():
    """Code written against the 0.1 family names gets the renamed objects."""
    proc = _run(
        "import warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import importlib\n"
        "import cc2ops\n"
        # (cc2ops.cross_map_norm the attribute is the builder, as for dropout)
        "norm = importlib.import_module('cc2ops.cross_map_norm')\n"
        "sce = importlib.import_module('cc2ops.softmax_cross_entropy')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always', DeprecationWarning)\n"
        "    from cc2ops.response_norm import CrossMapNorm, cross_map_norm_reference\n"
        "    from cc2ops.softmax_loss import SoftmaxCrossEntropy, TopKError\n"
        "assert len(caught) == 2, [str(w.message) for w in caught]\n"
        "assert all(w.category is DeprecationWarning for w in caught)\n"
        "assert CrossMapNorm is norm.CrossMapNorm is cc2ops.CrossMapNorm\n"
        "assert cross_map_norm_reference is norm.cross_map_norm_reference\n"
        "assert SoftmaxCrossEntropy is sce.SoftmaxCrossEntropy\n"
        "assert TopKError is sce.TopKError is cc2ops.TopKError\n"
        "import sys\n"
        "assert not [m for m in sys.modules if m.startswith('cc2ops.cuda')]\n"
        "import cc2ops.cuda.ops.cross_map_norm as gnorm\n"
        "import cc2ops.cuda.ops.softmax_cross_entropy as gsce\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always', DeprecationWarning)\n"
        "    from cc2ops.cuda.ops.response_norm import GpuCrossMapNorm\n"
        "    from cc2ops.cuda.ops.softmax_loss import (\n"
        "        GpuSoftmaxCrossEntropy,\n"
        "        softmax_loss_kernel_name,\n"
        "    )\n"
        "assert len(caught) == 3, [str(w.message) for w in caught]\n"
        "assert 'softmax_cross_entropy_kernel_name' in str(caught[2].message)\n"
        "assert GpuCrossMapNorm is gnorm.GpuCrossMapNorm\n"
        "assert GpuSoftmaxCrossEntropy is gsce.GpuSoftmaxCrossEntropy\n"
        "assert softmax_loss_kernel_name is gsce.softmax_cross_entropy_kernel_name\n"
    )
    assert proc.returncode == 0, proc.stderr


def test_old_package_path_warns_and_keeps_its_names():
    """``cc2ops.graph`` (now :mod:`cc2ops.rewriting`) warns when imported, and
    its modules are the moved ones; nothing in cc2ops imports it."""
    proc = _run(
        "import sys, warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import cc2ops, cc2ops.cuda, cc2ops.distributed\n"
        "assert 'cc2ops.graph' not in sys.modules, 'cc2ops imported cc2ops.graph'\n"
        "try:\n"
        "    import cc2ops.graph\n"
        "except DeprecationWarning as e:\n"
        "    print('warned:', e)\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "import cc2ops.graph as g\n"
        "import cc2ops.rewriting as r\n"
        "import cc2ops.distributed.hybrid as h\n"
        "assert g.db is r.db and g.fuse_softmax_loss is r.fuse_softmax_loss\n"
        "assert g.multi_gpu is h\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "warned: cc2ops.graph moved to cc2ops.rewriting" in proc.stdout


def test_moved_names_warn():
    import importlib

    # (cc2ops.cuda.mode the attribute is the mode function, as in 0.1)
    gpu_mode = importlib.import_module("cc2ops.cuda.mode")
    gpu_op = importlib.import_module("cc2ops.cuda.op")
    from cc2ops.cuda.ops import load_gpu_op_modules
    from cc2ops.cuda.transfer import as_gpu_cotangent

    with pytest.warns(DeprecationWarning, match="moved to cc2ops.cuda.transfer"):
        assert gpu_op.as_gpu_cotangent is as_gpu_cotangent
    with pytest.warns(DeprecationWarning, match="moved to cc2ops.cuda.ops"):
        assert gpu_mode.load_gpu_op_modules is load_gpu_op_modules
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        gpu_op.nothing  # noqa: B018


def test_every_gpu_op_module_is_listed():
    """The explicit module list replaced a pkgutil scan: every module under
    cc2ops/cuda/ops is in it (a new family must be added by name)."""
    from cc2ops.cuda.ops import load_gpu_op_modules

    on_disk = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "cc2ops" / "cuda" / "ops").rglob("*.py")
        # twins.py is the conv kernels' numpy test oracle: it registers nothing
        if p.name not in ("__init__.py", "twins.py")
    }
    listed = {m for m in load_gpu_op_modules() if m.startswith("cc2ops.cuda.ops.")}
    assert on_disk == listed


#: Private names still imported across modules, each with the reason it may.
_PRIVATE_IMPORTS_ALLOWED = {
    # the GPU mode's device-label check, inside cc2ops.cuda
    ("cc2ops/cuda/mode.py", "cc2ops.cuda.runtime.device", "_check_label"),
}


def test_op_families_import_no_private_names():
    """A GPU op module builds on its frontend module's public skeletons and
    rules only: no family module imports another module's private names."""
    import ast

    found = []
    for path in sorted((ROOT / "cc2ops").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "cc2ops/cuda/ops/conv/twins.py":
            continue  # the conv kernels' numpy test oracle mirrors igemm's internals
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module):
                continue
            if not node.module.startswith("cc2ops"):
                continue
            for alias in node.names:
                name = alias.name
                # private modules of a package (_aliases, _generic) are fine
                module = f"{node.module}.{name}"
                if not name.startswith("_") or module in (
                    "cc2ops._aliases",
                    "cc2ops.backends._generic",
                ):
                    continue
                if (rel, node.module, name) not in _PRIVATE_IMPORTS_ALLOWED:
                    found.append(f"{rel}:{node.lineno} {node.module}.{name}")
    assert found == [], found


@pytest.mark.parametrize(
    "family", ["pool", "conv", "cross_map_norm", "softmax_cross_entropy", "dropout"]
)
def test_host_and_gpu_ops_share_one_skeleton(family):
    """Each GPU op has its host op's shape rule, connection pattern, pullback
    and pushforward (the same functions, written once in the frontend), and
    each backend's family names its own ops, so gradients stay on it."""
    import importlib

    import cc2ops.cuda  # noqa: F401  (builds graphs only, no device needed)

    host = importlib.import_module(f"cc2ops.{family}").HOST_FAMILY
    gpu = importlib.import_module(
        f"cc2ops.cuda.ops.{'conv.ops' if family == 'conv' else family}"
    ).GPU_FAMILY
    assert type(host) is type(gpu) and len(host) == len(gpu)
    for h, g in zip(host, gpu, strict=True):
        assert g.__name__ == f"Gpu{h.__name__}"
        assert not issubclass(g, h) and not issubclass(h, g)  # lifting is by type
        for name in ("_infer_shape", "connection_pattern", "pullback", "pushforward"):
            assert getattr(g, name, None) is getattr(h, name, None), (g.__name__, name)
        assert h.family is host and g.family is gpu
