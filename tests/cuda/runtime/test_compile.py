"""Kernel templates and the nvcc cubin cache (CPU: needs nvcc, not a GPU).

Every registered kernel variant is rendered and compiled for sm_90, or for
the arch-specific target its family's rule names (sm_90a for wgmma). Skipped
only where nvcc is absent (a documented limit: without the toolkit there is
nothing to compile with). ``CC2OPS_CACHE_DIR`` points at a temporary
directory in every test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from multiprocessing.pool import ThreadPool
from pathlib import Path

import numpy as np
import pytest
from helpers import needs_nvcc

from cc2ops.cuda.ops import load_gpu_op_modules
from cc2ops.cuda.runtime import compile as ccompile
from cc2ops.cuda.runtime.compile import (
    KERNEL_DIR,
    KernelCompileError,
    NvccNotFoundError,
    all_variants,
    compile_cubin,
    compile_stats,
    find_nvcc,
    kernel_arch,
    kernel_name,
    precompile,
    register_arch_suffix,
    register_variants,
    render,
)

ARCH = "sm_90"
REPO = Path(__file__).resolve().parents[3]

SOURCE = textwrap.dedent(
    """
    extern "C" __global__ void cc2ops_test_axpy(
        float a, const float* x, float* y, int n)
    {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = a * x[i] + y[i];
    }
    """
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cubin cache directory, counters reset, debug off."""
    d = tmp_path / "kernels"
    monkeypatch.setenv("CC2OPS_CACHE_DIR", str(d))
    monkeypatch.delenv("CC2OPS_DEBUG", raising=False)
    ccompile.reset_compile_stats()
    return d


def cubins(d: Path) -> list[Path]:
    return sorted(d.glob("*.cubin")) if d.exists() else []


# --------------------------------------------------------------------------
# every variant compiles
# --------------------------------------------------------------------------


def test_every_registered_variant_renders_and_compiles(cache):
    needs_nvcc()
    modules = load_gpu_op_modules()
    assert "cc2ops.cuda.runtime.array" in modules
    variants = list(all_variants())
    families = {f for f, _ in variants}
    assert {"copy", "fill"} <= families, families
    # the arch-specific variants are among them (conv_igemm's wgmma tiles)
    assert any(kernel_arch(f, ARCH, **c) == "sm_90a" for f, c in variants)

    def build(item):
        family, consts = item
        try:
            source = render(family, **consts)
            if "name" in consts:
                assert f'extern "C" __global__ void {consts["name"]}(' in source, (
                    f'{family} {consts}: no extern "C" kernel named {consts["name"]}'
                )
            cubin = compile_cubin(source, kernel_arch(family, ARCH, **consts))
            assert cubin[:4] == b"\x7fELF", f"{family} {consts}: not an ELF cubin"
            return None
        except Exception as e:  # collect every failure with its nvcc log
            return f"{family} {consts}:\n{e}"

    with ThreadPool(2) as pool:
        failures = [f for f in pool.map(build, variants) if f is not None]
    assert not failures, "\n\n".join(failures)
    # names carry the specialisation: one name per variant of a family
    for family in families:
        names = [c.get("name") for f, c in variants if f == family]
        assert len(set(names)) == len(names), (family, names)


def test_runtime_kernel_names_carry_the_specialisation():
    assert kernel_name("copy", unit=4, maxdim=12) == "copy_u4_d12"
    assert kernel_name("fill", unit=8) == "fill_u8"
    for family, consts in all_variants():
        if family in ("copy", "fill"):
            assert kernel_name(family, **consts) == consts["name"]


# --------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------


def test_render_substitutes_constants_and_includes_the_header():
    src = render("copy", name="copy_u2_d3", unit=2, maxdim=3)
    assert 'extern "C" __global__ void copy_u2_d3(' in src
    assert "const u16* __restrict__ src" in src
    assert "index_t n2, index_t s2)" in src and "n3" not in src
    assert "#define CC2_GRID_STRIDE_LOOP" in src  # common.cuh, inlined
    assert "<%" not in src and "${" not in src


def test_render_errors():
    with pytest.raises(
        ValueError, match=r"render\(copy\): the template uses a constant .*'maxdim'"
    ):
        render("copy", name="k", unit=4)
    with pytest.raises(
        TypeError, match=r"constant unit=\[4\] must be an int, float, str or bool"
    ):
        render("copy", name="k", unit=[4], maxdim=2)
    with pytest.raises(
        ValueError, match="no kernel template nope.cu .*families: .*copy"
    ):
        render("nope")
    with pytest.raises(ValueError, match="kernel family must be an identifier"):
        render("../copy")
    # numpy scalars are accepted as constants
    assert "copy_u4_d2" in render("copy", name="copy_u4_d2", unit=np.int64(4), maxdim=2)


def test_default_kernel_names():
    assert kernel_name("demo", kind="max", s=3, f=1.5, flag=True, name="ignored") == (
        "demo_f1p5_flag1_kindmax_s3"
    )
    assert kernel_name("x", v=-0.25) == "x_vm0p25"
    assert kernel_name("x", tag="a-b") == "x_taga_b"


def test_kernel_arch_follows_the_family_rule(monkeypatch):
    monkeypatch.setattr(ccompile, "_arch_suffixes", {})
    assert kernel_arch("demo", "sm_90", special=1) == "sm_90"  # no rule

    @register_arch_suffix("demo")
    def rule(special=0, **_):
        return "a" if special else ""

    assert kernel_arch("demo", "sm_90", special=1) == "sm_90a"
    assert kernel_arch("demo", "sm_90a", special=1) == "sm_90a"
    assert kernel_arch("demo", "sm_90", special=0) == "sm_90"
    assert kernel_arch("demo", "sm_100", special=1) == "sm_100a"
    assert kernel_arch("other", "sm_90", special=1) == "sm_90"
    with pytest.raises(ValueError, match="arch must look like 'sm_90'"):
        kernel_arch("demo", "compute_90", special=1)
    register_arch_suffix("demo")(lambda **_: "arch")
    with pytest.raises(ValueError, match="must return '' or one lowercase letter"):
        kernel_arch("demo", "sm_90")


def test_precompile_builds_the_arch_specific_target(cache, monkeypatch):
    """precompile (and get_module) compile for kernel_arch: a spec whose rule
    asks for sm_90a builds for sm_90a when the cache is for sm_90."""
    needs_nvcc()
    wgmma = 'extern "C" __global__ void cc2ops_test_wg()\n'
    wgmma += '{\n    asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");\n}\n'
    with pytest.raises(KernelCompileError, match="not supported on .target 'sm_90'"):
        compile_cubin(wgmma, ARCH)
    monkeypatch.setattr(ccompile, "render", lambda family, **c: wgmma)
    monkeypatch.setattr(ccompile, "_check_family", lambda family: family)
    monkeypatch.setattr(ccompile, "_arch_suffixes", {})
    register_arch_suffix("demo")(lambda **c: "a" if c.get("wg") else "")
    assert precompile([ccompile.KernelSpec("demo", {"wg": 1})], arch=ARCH) == 1
    assert compile_cubin(wgmma, "sm_90a") and compile_stats()["cache_hits"] == 1


def test_register_variants(monkeypatch):
    monkeypatch.setattr(ccompile, "_variant_fns", {})

    @register_variants("fill")
    def fill_more():
        return [{"name": "fill_u1", "unit": 1}]

    register_variants("fill")(fill_more)  # registering twice keeps one
    assert list(all_variants()) == [("fill", {"name": "fill_u1", "unit": 1})]


# --------------------------------------------------------------------------
# the cubin cache
# --------------------------------------------------------------------------


def test_second_compile_hits_the_cache(cache):
    needs_nvcc()
    first = compile_cubin(SOURCE, ARCH)
    assert compile_stats() == {"nvcc_runs": 1, "cache_hits": 0}
    (path,) = cubins(cache)
    assert path.read_bytes() == first
    again = compile_cubin(SOURCE, ARCH)
    assert again == first
    assert compile_stats() == {"nvcc_runs": 1, "cache_hits": 1}
    assert not list(cache.glob("*.tmp")) and not list(cache.glob(".*tmp"))
    assert not list(cache.glob("*.cu"))  # sources are kept only on failure/debug


def test_a_fresh_process_reuses_the_cache_without_nvcc(cache):
    needs_nvcc()
    first = compile_cubin(SOURCE, ARCH)
    script = textwrap.dedent(
        f"""
        import hashlib, json
        from cc2ops.cuda.runtime.compile import compile_cubin, compile_stats
        data = compile_cubin({SOURCE!r}, {ARCH!r})
        print(json.dumps(dict(compile_stats(), sha=hashlib.sha256(data).hexdigest())))
        """
    )
    env = dict(os.environ, CC2OPS_CACHE_DIR=str(cache))
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    import hashlib

    assert stats == {
        "nvcc_runs": 0,
        "cache_hits": 1,
        "sha": hashlib.sha256(first).hexdigest(),
    }


def test_the_key_changes_with_options_and_arch(cache):
    needs_nvcc()
    base = compile_cubin(SOURCE, ARCH)
    compile_cubin(SOURCE, ARCH, ("-DCC2OPS_TEST_FLAG=1",))
    compile_cubin(SOURCE, "sm_80")
    assert compile_stats()["nvcc_runs"] == 3
    assert len(cubins(cache)) == 3
    changed = compile_cubin(SOURCE + "\n// another source\n", ARCH)
    assert compile_stats()["nvcc_runs"] == 4 and len(cubins(cache)) == 4
    assert compile_cubin(SOURCE, ARCH) == base
    assert changed != b""


def test_a_compile_error_shows_the_source_path_and_nvcc_log(cache):
    needs_nvcc()
    broken = 'extern "C" __global__ void broken(float* y)\n{\n'
    broken += "    y[0] = undefined_name;\n}\n"
    with pytest.raises(KernelCompileError) as info:
        compile_cubin(broken, ARCH)
    message = str(info.value)
    kept = [p for p in cache.glob("*.cu")]
    assert len(kept) == 1, kept
    assert str(kept[0]) in message
    assert kept[0].read_text() == broken
    assert "undefined_name" in message and "error" in message
    # nvcc's messages point into the kept file, at the right line
    assert f"{kept[0]}(3)" in message or f"{kept[0]}:3" in message
    assert "nvcc log:" in message and "-arch=sm_90" in message
    assert not cubins(cache)


def test_debug_keeps_the_source_and_adds_line_info(cache, monkeypatch):
    needs_nvcc()
    plain = compile_cubin(SOURCE, ARCH)
    monkeypatch.setenv("CC2OPS_DEBUG", "1")
    debug = compile_cubin(SOURCE, ARCH)
    assert compile_stats()["nvcc_runs"] == 2  # -lineinfo is part of the key
    assert debug != plain
    kept = list(cache.glob("*.cu"))
    assert len(kept) == 1 and kept[0].read_text() == SOURCE
    assert kept[0].with_suffix(".cubin").read_bytes() == debug
    # a debug cache hit keeps the source too, even after it was removed
    kept[0].unlink()
    compile_cubin(SOURCE, ARCH)
    assert kept[0].exists() and compile_stats()["cache_hits"] == 1


def test_compile_cubin_validates(cache):
    with pytest.raises(
        ValueError, match="arch must look like 'sm_90', got 'compute_90'"
    ):
        compile_cubin(SOURCE, "compute_90")
    with pytest.raises(TypeError, match="source must be a str"):
        compile_cubin(b"x", ARCH)
    with pytest.raises(TypeError, match="options must be strings"):
        compile_cubin(SOURCE, ARCH, (1,))


def test_missing_nvcc_is_a_clear_error(cache, monkeypatch):
    monkeypatch.setattr(ccompile, "find_nvcc", lambda: None)
    with pytest.raises(NvccNotFoundError, match="nvcc not found .* set CUDA_HOME"):
        compile_cubin(SOURCE, ARCH)


def test_find_nvcc_honours_cuda_home(tmp_path, monkeypatch):
    fake = tmp_path / "cuda" / "bin" / "nvcc"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho fake\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert find_nvcc() == str(fake)


def test_cache_dir_default(monkeypatch):
    monkeypatch.delenv("CC2OPS_CACHE_DIR", raising=False)
    assert ccompile.cache_dir() == Path.home() / ".cache" / "cc2ops" / "kernels"
    monkeypatch.setenv("CC2OPS_CACHE_DIR", "~/x")
    assert ccompile.cache_dir() == Path.home() / "x"


def test_kernel_dir_has_the_runtime_templates():
    for name in ("common.cuh", "copy.cu", "fill.cu"):
        assert (KERNEL_DIR / name).is_file()


# --------------------------------------------------------------------------
# launch argument checks (no GPU needed to reject bad arguments)
# --------------------------------------------------------------------------


def test_launch_argument_packing():
    values, types, fmt = ccompile._pack([np.int32(3), np.float32(1.5), np.int64(7)], 0)
    assert values == [3, 1.5, 7] and types == [np.int32, np.float32, np.int64]
    assert fmt == "ifl" or fmt == "ifq"
    with pytest.raises(TypeError, match="argument 1 is a int; pass GPUArrays"):
        ccompile._pack([np.int32(1), 5], 0)
    with pytest.raises(TypeError, match="argument 0 is a float"):
        ccompile._pack([1.0], 0)
    with pytest.raises(TypeError, match="argument 0 is a bool"):
        ccompile._pack([np.bool_(True)], 0)
    assert ccompile._dims("grid", 5) == (5, 1, 1)
    assert ccompile._dims("block", (32, 4)) == (32, 4, 1)
    with pytest.raises(ValueError, match="grid must be 1-3 ints >= 0"):
        ccompile._dims("grid", (1, 2, 3, 4))
    with pytest.raises(TypeError, match="block must be an int or 1-3 ints"):
        ccompile._dims("block", None)
