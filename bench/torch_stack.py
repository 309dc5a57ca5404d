"""The versions the transformers-side benchmark helpers report with their `check` command
(bench/dense/hf_encode.py, bench/engine/hf_generate.py import it from here)."""

import platform


def blas_name(torch):
    info = torch.__config__.show()
    for name in ("Intel(R) oneAPI Math Kernel Library", "MKL", "OpenBLAS", "BLIS"):
        if name in info:
            return "MKL" if "Math Kernel" in name else name
    return "unknown"


def stack(torch, transformers):
    """{"torch", "transformers", "python", "blas"}."""
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "blas": blas_name(torch)}
