"""Build of the NumPy backend's compiled loops (everything else is declared in pyproject.toml).

One shared library, backends/xconv_numpy/csrc/kernels.c, built once per instruction set (x86-64: baseline,
AVX2+FMA, AVX-512); the backend loads the best one the CPU runs (xconv_numpy/native.py). The extensions are
optional: without a C compiler the package still installs and the backend runs its NumPy paths. No compiler
ever runs after installation.
"""
import glob
import platform
import sys

from setuptools import Extension, setup

CSRC = "backends/xconv_numpy/csrc/"
FLAGS = ["-O3", "-ffp-contract=fast", "-fno-math-errno", "-std=gnu11", "-Wno-psabi"]
X86 = {
    "baseline": [],
    "avx2": ["-mavx2", "-mfma"],
    "avx512": ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"],
}


def _isas() -> dict:
    if sys.platform == "win32":          # MSVC takes other flags and lacks the GCC vector extensions
        return {}
    if platform.machine().lower() in ("x86_64", "amd64"):
        return X86
    return {"baseline": []}


setup(ext_modules=[
    Extension(f"xconv_numpy._kernels_{isa}", sources=[f"{CSRC}kernels_{isa}.c"],
              depends=sorted(glob.glob(CSRC + "*.[ch]")),
              extra_compile_args=FLAGS + flags, define_macros=[("XCONV_ISA", f'"{isa}"')], optional=True)
    for isa, flags in _isas().items()
])
