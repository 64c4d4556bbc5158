"""The one loader of NVIDIA bindings and libraries (cc2ops.cuda.runtime.libraries).

CPU tests: a missing binding raises the caller's error type naming the pip
package and the cuda extra; a library cuda-pathfinder cannot find raises it
with pathfinder's account; paths are memoised; importing cc2ops.cuda imports
none of the bindings (they are loaded on first use).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cc2ops.cuda.runtime import libraries

ROOT = Path(__file__).resolve().parents[3]


class Oops(RuntimeError):
    pass


@pytest.fixture
def fresh(monkeypatch):
    """Empty memo tables, so each test sees its own imports and loads."""
    monkeypatch.setattr(libraries, "_modules", {})
    monkeypatch.setattr(libraries, "_paths", {})


@pytest.mark.parametrize(
    "module, package",
    [
        ("cuda.bindings.driver", "cuda-bindings"),
        ("nvmath.bindings.cublas", "nvmath-python==1.0.1"),
        ("nccl.core", "nccl4py"),
        ("cuda.pathfinder", "cuda-pathfinder"),
    ],
)
def test_missing_binding_names_the_package(monkeypatch, fresh, module, package):
    monkeypatch.setitem(sys.modules, module, None)  # import of it fails
    with pytest.raises(Oops) as info:
        libraries.binding(module, user="the-user", error=Oops)
    text = str(info.value)
    assert text.startswith("the-user: the ")
    assert f"(module {module}) is not installed" in text
    assert f"`pip install {package}`" in text
    assert 'pip install "cc2ops[cuda]"' in text
    assert isinstance(info.value.__cause__, ImportError)


def test_binding_is_memoised(monkeypatch, fresh):
    fake = SimpleNamespace(name="fake")
    monkeypatch.setitem(sys.modules, "cc2ops_fake_binding", fake)
    assert libraries.binding("cc2ops_fake_binding", user="u") is fake
    monkeypatch.setitem(sys.modules, "cc2ops_fake_binding", None)
    assert libraries.binding("cc2ops_fake_binding", user="u") is fake


def _fake_pathfinder(found: dict[str, str]):
    calls = []

    class DynamicLibNotFoundError(RuntimeError):
        pass

    def load_nvidia_dynamic_lib(libname):
        calls.append(libname)
        if libname not in found:
            raise DynamicLibNotFoundError(f'Failure finding "lib{libname}.so"')
        return SimpleNamespace(abs_path=found[libname], found_via="site-packages")

    return SimpleNamespace(load_nvidia_dynamic_lib=load_nvidia_dynamic_lib), calls


def test_load_library_goes_through_pathfinder_once(monkeypatch, fresh):
    pathfinder, calls = _fake_pathfinder({"cublas": "/w/nvidia/cu13/libcublas.so.13"})
    monkeypatch.setitem(sys.modules, "cuda.pathfinder", pathfinder)
    assert libraries.library_path("cublas") is None
    path = libraries.load_library("cublas", user="u")
    assert path == "/w/nvidia/cu13/libcublas.so.13"
    assert libraries.load_library("cublas", user="u") == path
    assert libraries.library_path("cublas") == path
    assert calls == ["cublas"]


def test_library_not_found_is_the_callers_error(monkeypatch, fresh):
    pathfinder, _ = _fake_pathfinder({})
    monkeypatch.setitem(sys.modules, "cuda.pathfinder", pathfinder)
    with pytest.raises(Oops, match=r"u: the NVIDIA library 'nccl' could not be") as e:
        libraries.load_library("nccl", user="u", error=Oops)
    text = str(e.value)
    assert 'Failure finding "libnccl.so"' in text
    assert "LD_LIBRARY_PATH" in text and "$CUDA_PATH/$CUDA_HOME" in text
    assert libraries.library_path("nccl") is None


def test_load_library_without_pathfinder(monkeypatch, fresh):
    monkeypatch.setitem(sys.modules, "cuda.pathfinder", None)
    with pytest.raises(Oops, match="pip install cuda-pathfinder"):
        libraries.load_library("cublas", user="u", error=Oops)


def test_real_pathfinder_reports_a_missing_library(fresh):
    """With cuda-pathfinder installed: an unknown name is refused by it, and the
    message comes back in the caller's type."""
    pytest.importorskip("cuda.pathfinder")
    with pytest.raises(Oops, match="'no-such-nvidia-lib' could not be loaded"):
        libraries.load_library("no-such-nvidia-lib", user="u", error=Oops)


def test_import_cc2ops_cuda_loads_no_binding():
    code = (
        "import json, sys\nimport cc2ops.cuda\nprint(json.dumps(sorted(sys.modules)))"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    bindings = [
        m
        for m in loaded
        if m.split(".")[0] in ("nvmath", "nccl")
        or m.startswith(("cuda.bindings", "cuda.pathfinder", "cuda.core"))
    ]
    assert bindings == [], f"import cc2ops.cuda loaded {bindings}"
