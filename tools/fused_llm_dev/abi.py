"""The Hub's ABI rules, checked with Hugging Face's own checker on what ``fused-llm build`` writes.

A kernel ``.so`` on the Hub must load on any manylinux_2_28 system (GLIBC <= 2.28, GLIBCXX <=
3.4.24, CXXABI <= 1.3.11) and in any CPython >= 3.9 (abi3). ``kernel-builder check-abi`` (what
``kernels check`` now points to) runs the ``kernel-abi-check`` library for that; this module
runs the same two checks with the same defaults (``manylinux_2_28``, Python ABI ``3.9``) on
every ``.so`` of every arch variant in ``PKG/build/``, and says for each offending symbol where
it comes from and what to do, so a variant that cannot pass on a given machine says why.

``pip install kernel-abi-check==0.14.1`` (part of the ``test`` extra).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

MANYLINUX = "manylinux_2_28"
PYTHON_ABI = "3.9"  # the Py_LIMITED_API the builder compiles with (0x03090000)


class AbiCheckUnavailable(RuntimeError):
    """kernel-abi-check is not installed."""


@dataclass(frozen=True)
class AbiProblem:
    """One symbol that breaks a rule: ``rule`` is the manylinux tag or ``abi3``."""

    so: Path
    rule: str
    symbol: str
    needs: str  # "GLIBC 2.32", "Python 3.10", "not in the limited API"
    why: str

    def __str__(self) -> str:
        return f"{self.so.name}: {self.symbol} ({self.needs}) breaks {self.rule}: {self.why}"


@dataclass
class VariantAbi:
    """The result for one variant directory: the ``.so`` files checked and the problems."""

    variant_dir: Path
    objects: list[Path] = field(default_factory=list)
    problems: list[AbiProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        name = f"{self.variant_dir.parent.parent.name}/{self.variant_dir.name}"
        if not self.objects:
            return f"{name}: no native code (noarch), nothing to check"
        if self.ok:
            return f"{name}: {', '.join(o.name for o in self.objects)} pass {MANYLINUX} and abi3 (Python {PYTHON_ABI})"
        return "\n".join([f"{name}: {len(self.problems)} problem(s)", *(f"  {p}" for p in self.problems)])


def _checker():
    try:
        import kernel_abi_check
    except ImportError:
        raise AbiCheckUnavailable(
            "the ABI check needs Hugging Face's checker: pip install kernel-abi-check==0.14.1"
        ) from None
    return kernel_abi_check


# glibc 2.34 folded libpthread, libdl and librt into libc and re-versioned their functions.
_GLIBC_2_34_MOVED = re.compile(r"^(pthread_|dl|sem_|shm_|timer_|mq_|aio_|__pthread)")


def explain(symbol: str, dep: str, version: str) -> str:
    """Where a too-new symbol comes from and what keeps it out (the builder's compat header
    covers the cases headers cause; the rest need a source change or an older toolchain)."""
    if dep == "GLIBC":
        if symbol == "__libc_single_threaded":
            return ("libstdc++ >= 11 headers read glibc >= 2.32's single-thread flag; the builder's "
                    "fused_llm_glibc_compat.h redirects it, so this object was compiled without that "
                    "header (not by fused-llm build, or an old build: rebuild with --clean)")
        if symbol.startswith("__isoc23_"):
            return ("glibc >= 2.38 redirects strtol/scanf & co. to C23 versions under _GNU_SOURCE; "
                    "fused_llm_glibc_compat.h turns that off, so this object was compiled without it")
        if version == "2.34" and _GLIBC_2_34_MOVED.match(symbol):
            return ("glibc 2.34 moved libpthread/libdl into libc with new symbol versions; "
                    "fused_llm_glibc_compat.h binds the old version in C++ sources, but not in nvcc "
                    "sources and not for functions outside its list (builder.GLIBC_2_34_RENAMED): "
                    "add it there, or move the call into a .cpp file")
        return (f"the build machine's glibc provides {symbol} at version {version} > 2.28; avoid the "
                "call or build on a glibc 2.28 toolchain (kernel-builder's Nix build)")
    if dep in ("GLIBCXX", "CXXABI"):
        return (f"a libstdc++ symbol newer than GCC 8's ({dep} {version}) from the host compiler's "
                "headers; the system libstdc++ of a manylinux_2_28 machine lacks it: avoid the "
                "construct that instantiates it, or build with kernel-builder's toolchain")
    return f"{dep} {version} is newer than {MANYLINUX} allows"


def check_object(so: Path, manylinux: str = MANYLINUX, python_abi: str = PYTHON_ABI) -> list[AbiProblem]:
    """Both checks of ``kernel-builder check-abi`` on one shared object."""
    kac = _checker()
    obj = kac.ObjectFile(str(so))
    problems = [
        AbiProblem(so, manylinux, v.name, f"{v.dep} {v.version}", explain(v.name, v.dep, v.version))
        for v in obj.check_manylinux(manylinux)
    ]
    for v in obj.check_python_abi(python_abi):
        if isinstance(v, kac.IncompatibleAbi3Symbol):
            needs, why = f"Python {v.version_added}", f"added to the stable ABI after Python {python_abi}"
        else:
            needs, why = "not in the limited API", (
                "CPython API outside the stable ABI; the builder compiles with "
                "Py_LIMITED_API=0x03090000, so a source or header bypasses it")
        problems.append(AbiProblem(so, "abi3", v.name, needs, why))
    return problems


def check_variant(variant_dir: Path, manylinux: str = MANYLINUX, python_abi: str = PYTHON_ABI) -> VariantAbi:
    """Every shared object of one variant (a noarch variant has none)."""
    result = VariantAbi(Path(variant_dir))
    for so in sorted(Path(variant_dir).rglob("*.so")):
        result.objects.append(so)
        result.problems += check_object(so, manylinux, python_abi)
    return result


def check_package(pkg_dir: Path, manylinux: str = MANYLINUX, python_abi: str = PYTHON_ABI) -> list[VariantAbi]:
    """Every variant in ``pkg_dir/build/`` (what an upload would take)."""
    build = Path(pkg_dir) / "build"
    if not build.is_dir():
        raise FileNotFoundError(f"{build}: no build yet: run `fused-llm build {Path(pkg_dir).name}`")
    variants = sorted(p for p in build.iterdir() if p.is_dir() and (p / "metadata.json").is_file())
    if not variants:
        raise FileNotFoundError(f"{build}: no variant directory (with a metadata.json) to check")
    return [check_variant(v, manylinux, python_abi) for v in variants]
