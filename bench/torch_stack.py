"""The versions the transformers-side benchmark helpers report with their `check` command
(bench/dense/hf_encode.py, bench/dense/rerank_bench.py, bench/engine/hf_generate.py import it
from here)."""

import platform
import re


def blas_name(torch):
    """The BLAS torch was built with (its config's BLAS_INFO); for a "generic" build, such as
    Debian's python3-torch, the one the system's libblas.so.3 loaded into this process. (The
    config also names MKL-DNN, oneDNN, which is no BLAS.)"""
    info = torch.__config__.show()
    m = re.search(r"BLAS_INFO=(\w+)", info)
    named = {"mkl": "MKL", "open": "OpenBLAS", "blis": "BLIS"}.get(m.group(1) if m else "")
    if named:
        return named
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        maps = ""
    for lib, name in (("libopenblas", "OpenBLAS"), ("libmkl_", "MKL"), ("libblis", "BLIS")):
        if lib in maps:
            return name
    return "unknown"


def stack(torch, transformers):
    """{"torch", "transformers", "python", "blas"}."""
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "blas": blas_name(torch)}
