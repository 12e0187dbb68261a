"""Local equivalent of ``kernel-builder create-pyproject`` + ``build_kernel``, without Nix.

``fused-llm build PKG`` reads ``PKG/build.toml`` (validated by the same Rust parser
kernel-builder uses, ``kernels._rust.Build``), compiles the ``[torch]`` sources and the
``[kernel.*]`` sections of one backend with ``torch.utils.cpp_extension`` + ninja (parallel),
and writes a variant directory in the Hub layout::

    PKG/build/torch213-cxx11-cpu-x86_64-linux/
        __init__.py, layers.py, ...        the package's Python files (torch-ext/<py>/)
        _ops.py                            generated: ``ops``, ``add_op_namespace_prefix``
        _<py>_<backend>_<7hex>.abi3.so     ops registered under that unique namespace
        metadata.json                      id, archs, sha256 digest (kernel-builder's format)

A ``[torch-noarch]`` package gets ``PKG/build/torch-<backend>/`` per backend instead.

``PKG/build/`` holds only variant directories (it is what a Hub upload takes as is); object
files live in ``PKG/.build-cache/<variant>/`` and a variant is staged in
``PKG/.build-cache/staging-*`` before it is renamed into ``build/``.

Rebuilds: an unchanged package rebuilds nothing; a change recompiles the package. The
content-addressed unique id (it hashes every source) is passed to every object as
``-DTORCH_EXTENSION_NAME``, so any source change changes every compile command.

The ``.so`` must pass the Hub's ABI check (manylinux_2_28, abi3) although the build machine's
glibc and libstdc++ are newer: every arch build force-includes ``GLIBC_COMPAT_H`` and compiles
``GLIBCXX_COMPAT_CPP`` (generated next to registration.h); ``fused-llm check-abi`` runs Hugging
Face's checker on the result. Hub uploads still go through kernel-builder/Nix.

Compilation runs in a child process: a ``.so`` that registers a ``TORCH_LIBRARY`` namespace
can be loaded once per process, and ``cpp_extension.load`` loads what it builds.
"""

from __future__ import annotations

import contextlib
import filecmp
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

BACKENDS = ("cpu", "cuda", "rocm")
# Definitions the generated CMake project of kernel-builder passes per backend.
BACKEND_DEFINES = {
    "cpu": ["-DCPU_KERNEL"],
    "cuda": ["-DCUDA_KERNEL", "-DUSE_CUDA"],
    "rocm": ["-DROCM_KERNEL", "-DUSE_ROCM"],
}
# The .so must be loadable by any CPython >= 3.9 (Hub rule: abi3).
PY_LIMITED_API = "-DPy_LIMITED_API=0x03090000"
# Generated next to registration.h and force-included everywhere (see GLIBC_COMPAT_H).
GLIBC_COMPAT_NAME = "fused_llm_glibc_compat.h"


class BuildError(RuntimeError):
    """A package cannot be built; the message says which file, key or tool is at fault."""


class BuildWarning(UserWarning):
    """The build goes on, but not as asked (e.g. ``--backend auto`` fell back to cpu)."""


# ---------------------------------------------------------------------------------------
# build.toml
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelSection:
    name: str
    backend: str
    depends: tuple[str, ...]
    src: tuple[str, ...]
    include: tuple[str, ...] = ()
    cxx_flags: tuple[str, ...] = ()
    cuda_capabilities: tuple[str, ...] = ()
    cuda_flags: tuple[str, ...] = ()
    rocm_archs: tuple[str, ...] = ()
    hip_flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuildConfig:
    path: Path
    name: str
    version: int
    license: str
    backends: tuple[str, ...]
    python_depends: tuple[str, ...]
    kernel_depends: tuple[dict, ...]
    noarch: bool
    torch_src: tuple[str, ...] = ()
    torch_include: tuple[str, ...] = ()
    torch_cxx_flags: tuple[str, ...] = ()
    pyext: tuple[str, ...] = ("py", "pyi")
    noarch_cuda_capabilities: tuple[str, ...] = ()
    noarch_rocm_archs: tuple[str, ...] = ()
    kernels: tuple[KernelSection, ...] = field(default_factory=tuple)

    @property
    def python_name(self) -> str:
        return self.name.replace("-", "_")

    def kernels_for(self, backend: str) -> list[KernelSection]:
        return [k for k in self.kernels if k.backend == backend]


def load_config(pkg_dir: Path) -> BuildConfig:
    """Parse and validate ``pkg_dir/build.toml``.

    Validation is kernel-builder's own (``kernels._rust.Build.open``: edition 5 schema,
    unknown keys are errors); the TOML is then read again for the fields that parser does
    not expose (sources, flags, capabilities)."""
    pkg_dir = Path(pkg_dir).resolve()
    toml_path = pkg_dir / "build.toml"
    if not toml_path.is_file():
        raise BuildError(f"{toml_path}: no such file (a kernel package needs a build.toml)")
    from kernels._rust import Build  # kernels_data 0.16.2 lacks Build; the parser ships here

    try:
        Build.open(pkg_dir)
    except ValueError as err:
        raise BuildError(_explain_toml_error(toml_path, str(err))) from None
    data = tomllib.loads(toml_path.read_text())
    general = data["general"]
    if general.get("edition") != 5:
        raise BuildError(f"{toml_path}: [general] edition must be 5 (got {general.get('edition')!r})")

    def tup(table: dict, key: str) -> tuple:
        return tuple(table.get(key, ()))

    kernels = tuple(
        KernelSection(
            name=kname,
            backend=k["backend"],
            depends=tup(k, "depends"),
            src=tup(k, "src"),
            include=tup(k, "include"),
            cxx_flags=tup(k, "cxx-flags"),
            cuda_capabilities=tup(k, "cuda-capabilities"),
            cuda_flags=tup(k, "cuda-flags"),
            rocm_archs=tup(k, "rocm-archs"),
            hip_flags=tup(k, "hip-flags"),
        )
        for kname, k in data.get("kernel", {}).items()
    )
    noarch = "torch-noarch" in data
    torch = data.get("torch", {})
    noarch_table = data.get("torch-noarch", {})
    config = BuildConfig(
        path=pkg_dir,
        name=general["name"],
        version=general["version"],
        license=general["license"],
        backends=tuple(general["backends"]),
        python_depends=tup(general, "python-depends"),
        kernel_depends=tup(general, "kernel-depends"),
        noarch=noarch,
        torch_src=tup(torch, "src"),
        torch_include=tup(torch, "include"),
        torch_cxx_flags=tup(torch, "cxx-flags"),
        pyext=tuple(torch.get("pyext", noarch_table.get("pyext", ("py", "pyi")))),
        noarch_cuda_capabilities=tup(noarch_table, "cuda_capabilities"),
        noarch_rocm_archs=tup(noarch_table, "rocm_archs"),
        kernels=kernels,
    )
    for rel in (*config.torch_src, *(s for k in kernels for s in k.src)):
        if not (pkg_dir / rel).is_file():
            raise BuildError(f"{toml_path}: source {rel!r} does not exist")
    if not (pkg_dir / "torch-ext" / config.python_name / "__init__.py").is_file():
        raise BuildError(f"{pkg_dir}: torch-ext/{config.python_name}/__init__.py is required")
    return config


def _explain_toml_error(toml_path: Path, message: str) -> str:
    """Add the line of the offending key to the parser's message, when it names one."""
    match = re.search(r"[Uu]nknown (?:field|variant) `?([\w-]+)`?", message)
    if match:
        key = match.group(1)
        for lineno, line in enumerate(toml_path.read_text().splitlines(), 1):
            if re.match(rf"\s*{re.escape(key)}\s*=", line):
                return f"{toml_path}:{lineno}: invalid key {key!r}: {message}"
    return f"{toml_path}: {message}"


# ---------------------------------------------------------------------------------------
# Naming: variants, ids
# ---------------------------------------------------------------------------------------


def torch_backend() -> str:
    """The backend the running torch was built for."""
    import torch

    if torch.version.cuda:
        return "cuda"
    if torch.version.hip:
        return "rocm"
    return "cpu"


def arch_variant_name(backend: str) -> str:
    """``torch213-cxx11-cpu-x86_64-linux`` / ``torch211-cxx11-cu130-x86_64-linux``: the name
    the kernels loader selects for the running torch (see kernels.variants)."""
    import torch

    major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if backend == "cuda":
        cu_major, cu_minor = torch.version.cuda.split(".")[:2]
        tag = f"cu{cu_major}{cu_minor}"
    elif backend == "rocm":
        ro_major, ro_minor = torch.version.hip.split(".")[:2]
        tag = f"rocm{ro_major}{ro_minor}"
    else:
        tag = "cpu"
    abi = "cxx11" if torch.compiled_with_cxx11_abi() else "cxx98"
    system = platform.system().lower()
    return f"torch{major}{minor}-{abi}-{tag}-{platform.machine()}-{system}"


def source_files(config: BuildConfig, backend: str | None = None) -> list[Path]:
    """Every file whose content defines the build (and so its unique id)."""
    files = {config.path / "build.toml"}
    files.update(config.path / s for s in config.torch_src)
    for k in config.kernels:
        if backend is None or k.backend == backend:
            files.update(config.path / s for s in k.src)
    py_root = config.path / "torch-ext" / config.python_name
    files.update(p for ext in config.pyext for p in py_root.rglob(f"*.{ext}") if "__pycache__" not in p.parts)
    return sorted(files)


def unique_id(config: BuildConfig, backend: str, archs: Sequence[str] = ()) -> str:
    """``_<py>_<backend>_<7 hex of the sources>``: the op namespace, the .so name, the
    ``sys.modules`` key and metadata ``id``. Content-addressed, so an unchanged package keeps
    its id and two different builds never share one (kernel-builder uses the git tree id);
    ``archs`` enter the hash too, so a narrowed ``--capabilities`` build is a different id."""
    digest = hashlib.sha256()
    digest.update(",".join(archs).encode() + b"\0")
    if not config.noarch:  # the generated headers are compiled into every object
        digest.update(REGISTRATION_H.encode() + GLIBC_COMPAT_H.encode() + GLIBCXX_COMPAT_CPP.encode() + b"\0")
    for path in source_files(config, backend):
        digest.update(path.relative_to(config.path).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return f"_{config.python_name}_{backend}_{digest.hexdigest()[:7]}"


# ---------------------------------------------------------------------------------------
# CUDA capabilities
# ---------------------------------------------------------------------------------------


def find_nvcc() -> str:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [Path(cuda_home) / "bin" / "nvcc"] if cuda_home else []
    found = shutil.which("nvcc")
    if found:
        candidates.append(Path(found))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for cand in candidates:
        if cand.is_file():
            return str(cand)
    raise BuildError(
        "nvcc not found (looked in $CUDA_HOME/bin, PATH, /usr/local/cuda/bin): the cuda backend "
        "needs the CUDA toolkit; install it or build with --backend cpu"
    )


def toolkit_capabilities(nvcc: str) -> list[str]:
    """Capabilities this nvcc can target, as ``X.Y`` (from ``nvcc --list-gpu-arch``)."""
    try:
        proc = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True)
    except OSError as err:
        raise BuildError(f"cannot run `{nvcc} --list-gpu-arch`: {err}") from None
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip() or "(no output)"
        raise BuildError(f"`{nvcc} --list-gpu-arch` failed (exit {proc.returncode}):\n{detail}")
    caps = []
    for arch in re.findall(r"compute_(\d+)(?!\w)", proc.stdout):
        caps.append(f"{arch[:-1]}.{arch[-1]}")
    if not caps:
        raise BuildError(f"`{nvcc} --list-gpu-arch` listed no compute_XY architecture:\n{proc.stdout.strip()}")
    return caps


def section_capabilities(section: KernelSection, available: Sequence[str]) -> tuple[list[str], str]:
    """The capabilities a cuda section asks for, and where they come from: its
    ``cuda-capabilities``, or, without that key, every capability the toolkit supports (what
    kernel-builder's Nix build does)."""
    if section.cuda_capabilities:
        return list(section.cuda_capabilities), "cuda-capabilities"
    return list(available), "toolkit default (no cuda-capabilities)"


def narrow_capabilities(caps: Sequence[str], wanted: Sequence[str] | None, where: str) -> list[str]:
    """Keep the capabilities ``--capabilities`` names (``8.0`` also keeps ``8.0a``/``8.0f``).
    An empty result is an error that blames ``--capabilities``, not build.toml."""
    if not wanted:
        return list(caps)
    kept = [c for c in caps if c in wanted or c.rstrip("af") in wanted]
    if not kept:
        raise BuildError(
            f"{where}: --capabilities {','.join(wanted)} selects none of the capabilities this "
            f"build can target {list(caps)} (build.toml cuda-capabilities, or the toolkit's when "
            f"absent, ∩ toolkit)"
        )
    return kept


def select_capabilities(requested: Sequence[str], available: Sequence[str], where: str, source: str = "cuda-capabilities") -> list[str]:
    """Loose intersection, as kernel-builder does: ``9.0a`` survives when ``9.0`` is available.
    An empty result is an error; ``source`` says where ``requested`` came from."""
    kept = [c for c in requested if c.rstrip("af") in available]
    if not kept:
        raise BuildError(
            f"{where}: no CUDA capability left: {source} {list(requested)} ∩ "
            f"toolkit {list(available)} is empty"
        )
    return kept


def gencode_flags(caps: Sequence[str]) -> tuple[list[str], list[str]]:
    """nvcc flags and metadata archs. Every capability gets machine code; the highest plain
    one also gets PTX (recorded as ``X.Y+PTX``) so newer GPUs can JIT it, like torch's
    ``+PTX``. ``8.0`` alone thus gives sm_80 + PTX, which lets a Hopper run the sm80 path."""
    flags, archs = [], []
    plain = [c for c in caps if not c.endswith(("a", "f"))]
    ptx_cap = max(plain, key=lambda c: tuple(int(p) for p in c.split("."))) if plain else None
    for cap in caps:
        num = cap.replace(".", "")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if cap == ptx_cap:
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
            archs.append(f"{cap}+PTX")
        else:
            archs.append(cap)
    return flags, archs


def cutlass_include() -> str:
    """CUTLASS/CuTe headers from the ``nvidia-cutlass`` wheel (``cutlass_*`` depends)."""
    try:
        import cutlass_library
    except ImportError:
        raise BuildError("a cutlass_* dependency needs the nvidia-cutlass wheel: pip install nvidia-cutlass==4.2.0.0") from None
    include = Path(cutlass_library.__file__).parent / "source" / "include"
    if not include.is_dir():
        raise BuildError(f"nvidia-cutlass is installed but {include} is missing")
    return str(include)


def include_dirs(config: BuildConfig, sections: Iterable[KernelSection]) -> list[str]:
    dirs = [str(config.path / d) for d in config.torch_include]
    for k in sections:
        dirs += [str(config.path / d) for d in k.include]
        if any(d.startswith("cutlass_") for d in k.depends):
            dirs.append(cutlass_include())
    return list(dict.fromkeys(dirs))


# ---------------------------------------------------------------------------------------
# Generated files
# ---------------------------------------------------------------------------------------

REGISTRATION_H = """\
// Generated by fused-llm build (the local stand-in for kernel-builder). Do not edit.
#pragma once
#include <Python.h>

#define FLLM_CONCAT_(A, B) A##B
#define FLLM_CONCAT(A, B) FLLM_CONCAT_(A, B)
#define FLLM_STRINGIFY_(A) #A
#define FLLM_STRINGIFY(A) FLLM_STRINGIFY_(A)

// Expand NAME (TORCH_EXTENSION_NAME) before it reaches the torch macros.
#define TORCH_LIBRARY_EXPAND(NAME, MODULE) TORCH_LIBRARY(NAME, MODULE)
#define TORCH_LIBRARY_IMPL_EXPAND(NAME, DEVICE, MODULE) TORCH_LIBRARY_IMPL(NAME, DEVICE, MODULE)

// An empty Python module, so `from . import <id>` loads the .so (and its op registrations).
#define REGISTER_EXTENSION(NAME)                                                     \\
  PyMODINIT_FUNC FLLM_CONCAT(PyInit_, NAME)() {                                     \\
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, FLLM_STRINGIFY(NAME), \\
                                        nullptr, 0, nullptr};                        \\
    return PyModule_Create(&module);                                                 \\
  }
"""

# Force-included (-include) into every C++ and CUDA translation unit of an arch build, so the
# .so passes Hugging Face's ABI check (kernel-abi-check: manylinux_2_28, i.e. GLIBC <= 2.28)
# when the build machine's glibc is newer. Each item is a symbol that *headers* pull in, so a
# source change cannot avoid it; each is bound to what the same headers produce on glibc 2.28.
# Measured here (gcc 12.2, glibc 2.36): without it the rmsnorm-fp8 and swiglu-fp8 CPU .so
# referenced __libc_single_threaded@GLIBC_2.32; a probe using std::call_once and std::thread
# also referenced pthread_once@GLIBC_2.34 (tests/test_abi.py compiles that probe).
GLIBC_COMPAT_H = """\
// Generated by fused-llm build. Do not edit. Keeps a build on a newer glibc within
// manylinux_2_28 (GLIBC <= 2.28), the Hub's rule for kernel .so files.
#pragma once
#if defined(__linux__) && __has_include(<features.h>)
#include <features.h>
#endif

#if defined(__GLIBC__)

// 1. glibc >= 2.32 exports __libc_single_threaded (GLIBC_2.32), and libstdc++ >= 11 reads it
//    (ext/atomicity.h, under the same __has_include) to skip atomic reference counts in a
//    single-threaded process. Redirect the read to a constant "not single-threaded": every
//    count stays atomic, which is what the same headers do on glibc 2.28 (the flag is absent
//    there and __gthread_active_p() is true in any process that loaded torch).
#if __has_include(<sys/single_threaded.h>)
#include <sys/single_threaded.h>
static const char fused_llm_libc_never_single_threaded = 0;
#define __libc_single_threaded fused_llm_libc_never_single_threaded
#endif

// 2. glibc >= 2.38 (C2X/C23 under _GNU_SOURCE, which g++ always defines) redirects strtol,
//    sscanf & co. to __isoc23_* (GLIBC_2.38), whose only difference is parsing a 0b prefix.
//    Keep the classic functions. (Not exercised on glibc 2.36 here; the GPU machine's is newer.)
#ifdef __GLIBC_USE_C2X_STRTOL
#undef __GLIBC_USE_C2X_STRTOL
#define __GLIBC_USE_C2X_STRTOL 0
#endif
#ifdef __GLIBC_USE_C23_STRTOL
#undef __GLIBC_USE_C23_STRTOL
#define __GLIBC_USE_C23_STRTOL 0
#endif

// 3. glibc 2.34 moved libpthread and libdl into libc and gave their functions a new default
//    version GLIBC_2.34; the old version is still exported (the same function). gthreads
//    (std::call_once, std::thread, thread-specific data), std::shared_mutex and dlopen users
//    reference these. Bind the references to the old version. Not in nvcc translation units:
//    how cudafe++ treats file-scope asm is unverified here, and the .cu sources are
//    framework-free device code (tools/gpu-session.sh abi-check shows what they reference).
#if __GLIBC__ == 2 && __GLIBC_MINOR__ >= 34 && !defined(__CUDACC__)
#if defined(__x86_64__)
#define FUSED_LLM_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define FUSED_LLM_GLIBC_BASE "GLIBC_2.17"
#endif
#ifdef FUSED_LLM_GLIBC_BASE
#define FUSED_LLM_OLD_SYMBOL(name) __asm__(".symver " #name "," #name "@" FUSED_LLM_GLIBC_BASE);
GLIBC_OLD_SYMBOLS
#undef FUSED_LLM_OLD_SYMBOL
#undef FUSED_LLM_GLIBC_BASE
#endif
#endif

#endif  // __GLIBC__
"""
# Functions glibc 2.34 re-versioned whose x86_64 base version (GLIBC_2.2.5; aarch64: 2.17)
# still exists: those gthreads wraps (gcc 12 bits/gthr-posix.h), std::shared_mutex's rwlock
# calls and dlopen & co. tests/test_abi.py links a probe that calls every one of them.
GLIBC_2_34_RENAMED = (
    "pthread_once", "pthread_key_create", "pthread_key_delete", "pthread_getspecific", "pthread_setspecific",
    "pthread_create", "pthread_join", "pthread_detach", "pthread_cancel",
    "pthread_mutex_trylock", "pthread_mutex_timedlock",
    "pthread_mutexattr_init", "pthread_mutexattr_destroy", "pthread_mutexattr_settype",
    "pthread_rwlock_init", "pthread_rwlock_destroy", "pthread_rwlock_rdlock", "pthread_rwlock_tryrdlock",
    "pthread_rwlock_wrlock", "pthread_rwlock_trywrlock", "pthread_rwlock_unlock",
    "pthread_rwlock_timedrdlock", "pthread_rwlock_timedwrlock",
    "dlopen", "dlsym", "dlclose", "dlerror", "dladdr",
)
GLIBC_COMPAT_H = GLIBC_COMPAT_H.replace(
    "GLIBC_OLD_SYMBOLS", "\n".join(f"FUSED_LLM_OLD_SYMBOL({name})" for name in GLIBC_2_34_RENAMED)
)

# Compiled into every arch build. manylinux_2_28 also caps libstdc++ at GLIBCXX_3.4.24 (GCC 8),
# and torch's CUDA headers make the extension reference two newer entry points: c10::str()'s
# std::ostringstream, instantiated in c10::detail::_str_wrapper by the TORCH_CHECKs of
# c10/cuda and ATen/cuda headers, calls GCC 9's default constructor (GLIBCXX_3.4.26) and, in
# C++20 (torch 2.13's minimum), the ref-qualified basic_stringbuf::str() const& (GCC 11,
# GLIBCXX_3.4.29). Measured here (gcc 12.2, nvcc 13.0, torch 2.13 headers): the CUDA objects of
# rmsnorm-fp8, swiglu-fp8 and gated-mlp, linked, referenced exactly those two. Each has an
# older equivalent in every libstdc++ since GCC 5 (GLIBCXX_3.4.21, the C++11 ABI); this file
# defines the new names inside the .so (hidden, so nothing else binds to them) as calls to the
# old ones. The sibling string streams and GCC 11's __throw_bad_array_new_length get the same
# treatment (tests/test_abi.py calls each); the C++20 rvalue overloads (str() &&,
# str(string&&)) and view() are not covered: `fused-llm check-abi` names them if they appear.
GLIBCXX_COMPAT_NAME = "fused_llm_glibcxx_compat.cpp"
GLIBCXX_COMPAT_CPP = """\
// Generated by fused-llm build. Do not edit. See GLIBCXX_COMPAT_CPP in fused_llm_dev/builder.py.
#include <new>
#include <sstream>
#include <string>

#if defined(__GLIBCXX__) && _GLIBCXX_USE_CXX11_ABI && defined(__ELF__) && !defined(__CUDACC__)
// weak: where g++ links libstdc++ statically (the GPU machine's /opt/gcc 13 pulls
// libstdc++.a(functexcept.o) into gated-mlp's CUTLASS objects), the library's own strong
// definition wins instead of colliding; against libstdc++.so these stay the ones used.
#define FLLM_LOCAL __attribute__((visibility("hidden"), used, weak))
#define FLLM_CXX11(name) "_ZNSt7__cxx11" name
#define FLLM_CXX11_CONST(name) "_ZNKSt7__cxx11" name
#define FLLM_CXX11_CONST_LREF(name) "_ZNKRSt7__cxx11" name

// Default constructors (GLIBCXX_3.4.26): the GCC 8 constructor with the default mode.
FLLM_LOCAL void fllm_ostringstream_ctor(std::ostringstream* self) __asm__(FLLM_CXX11("19basic_ostringstreamIcSt11char_traitsIcESaIcEEC1Ev"));
void fllm_ostringstream_ctor(std::ostringstream* self) { ::new (static_cast<void*>(self)) std::ostringstream(std::ios_base::out); }
FLLM_LOCAL void fllm_istringstream_ctor(std::istringstream* self) __asm__(FLLM_CXX11("19basic_istringstreamIcSt11char_traitsIcESaIcEEC1Ev"));
void fllm_istringstream_ctor(std::istringstream* self) { ::new (static_cast<void*>(self)) std::istringstream(std::ios_base::in); }
FLLM_LOCAL void fllm_stringstream_ctor(std::stringstream* self) __asm__(FLLM_CXX11("18basic_stringstreamIcSt11char_traitsIcESaIcEEC1Ev"));
void fllm_stringstream_ctor(std::stringstream* self) { ::new (static_cast<void*>(self)) std::stringstream(std::ios_base::out | std::ios_base::in); }
FLLM_LOCAL void fllm_stringbuf_ctor(std::stringbuf* self) __asm__(FLLM_CXX11("15basic_stringbufIcSt11char_traitsIcESaIcEEC1Ev"));
void fllm_stringbuf_ctor(std::stringbuf* self) { ::new (static_cast<void*>(self)) std::stringbuf(std::ios_base::in | std::ios_base::out); }

// std::__throw_bad_array_new_length() (GLIBCXX_3.4.29): GCC 11's std::allocator calls it when
// a size overflows; it throws std::bad_array_new_length (CXXABI_1.3.8), as the library's does.
[[noreturn]] FLLM_LOCAL void fllm_throw_bad_array_new_length() __asm__("_ZSt28__throw_bad_array_new_lengthv");
void fllm_throw_bad_array_new_length() { throw std::bad_array_new_length(); }

// str() const& (GLIBCXX_3.4.29): the same as the pre-C++20 str() const (GLIBCXX_3.4.21), whose
// symbol is declared here under another name (same calling convention: result, this).
#define FLLM_STR(cls, len_name)                                                                      \
  std::string fllm_old_str_##cls(const std::cls* self) __asm__(FLLM_CXX11_CONST(len_name "IcSt11char_traitsIcESaIcEE3strEv")); \
  FLLM_LOCAL std::string fllm_str_##cls(const std::cls* self) __asm__(FLLM_CXX11_CONST_LREF(len_name "IcSt11char_traitsIcESaIcEE3strEv")); \
  std::string fllm_str_##cls(const std::cls* self) { return fllm_old_str_##cls(self); }
FLLM_STR(stringbuf, "15basic_stringbuf")
FLLM_STR(ostringstream, "19basic_ostringstream")
FLLM_STR(istringstream, "19basic_istringstream")
FLLM_STR(stringstream, "18basic_stringstream")
#endif
"""

OPS_PY_ARCH = '''\
# Generated by fused-llm build. Do not edit.
import torch

from . import {id}

ops = torch.ops.{id}


def add_op_namespace_prefix(op_name: str) -> str:
    """Prefix op_name with this build's unique op namespace."""
    return f"{id}::{{op_name}}"
'''

OPS_PY_NOARCH = '''\
# Generated by fused-llm build. Do not edit.
import torch


def _backend() -> str:
    if torch.version.cuda is not None:
        return "cuda"
    if torch.version.hip is not None:
        return "rocm"
    return "cpu"


_OPS_NAMESPACE = "_{py}_" + _backend() + "_{uid}"
ops = getattr(torch.ops, _OPS_NAMESPACE)


def add_op_namespace_prefix(op_name: str) -> str:
    """Prefix op_name with this build's unique op namespace."""
    return f"{{_OPS_NAMESPACE}}::{{op_name}}"
'''


def write_metadata(variant_dir: Path, config: BuildConfig, kernel_id: str, backend: str, archs: list[str] | None) -> dict:
    """metadata.json as kernel-builder writes it, digest included (base64 sha256 of every
    file of the variant except metadata.json itself, computed by kernels_data)."""
    from kernels_data import Digest, DigestAlgorithm

    digest = Digest.hash_variant(DigestAlgorithm.SHA256, variant_dir)
    meta = {
        "name": config.name,
        "id": kernel_id,
        "version": config.version,
        "license": config.license,
        "python-depends": list(config.python_depends),
        "kernel-depends": list(config.kernel_depends),
        "backend": {"type": backend, **({"archs": archs} if archs else {})},
        "digest": {"algorithm": "sha256", "files": dict(sorted(digest.files.items()))},
    }
    (variant_dir / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def copy_python_package(config: BuildConfig, dest: Path) -> None:
    src_root = config.path / "torch-ext" / config.python_name
    for ext in config.pyext:
        for path in src_root.rglob(f"*.{ext}"):
            if "__pycache__" in path.parts:
                continue
            target = dest / path.relative_to(src_root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


# ---------------------------------------------------------------------------------------
# Compilation (child process)
# ---------------------------------------------------------------------------------------


@dataclass
class CompileJob:
    name: str
    sources: list[str]
    build_dir: str
    include_dirs: list[str]
    cflags: list[str]
    cuda_cflags: list[str]
    with_cuda: bool

    def run(self, on_progress: Callable[[int, int], None] | None = None) -> Path:
        """Compile in a child process; returns the built shared object."""
        Path(self.build_dir).mkdir(parents=True, exist_ok=True)
        with build_dir_lock(Path(self.build_dir)):
            return self._run(on_progress)

    def _run(self, on_progress: Callable[[int, int], None] | None) -> Path:
        job_file = Path(self.build_dir) / "job.json"
        job_file.write_text(json.dumps(self.__dict__))
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.setdefault("MAX_JOBS", str(os.cpu_count() or 2))
        proc = subprocess.Popen(
            [sys.executable, "-m", "fused_llm_dev.builder", "--compile-job", str(job_file)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            cwd=str(Path(__file__).resolve().parent.parent),
        )
        log = []
        for line in proc.stdout:
            log.append(line)
            step = re.match(r"\[(\d+)/(\d+)\]", line)
            if step and on_progress:
                on_progress(int(step.group(1)), int(step.group(2)))
        if proc.wait() != 0:
            raise BuildError(f"compiling {self.name} failed:\n{_compiler_errors(log)}")
        so = Path(self.build_dir) / f"{self.name}.so"
        if not so.is_file():
            raise BuildError(f"compiling {self.name}: {so} was not produced:\n{''.join(log[-40:])}")
        return so


@contextlib.contextmanager
def build_dir_lock(build_dir: Path):
    """Holds an exclusive ``flock`` on ``build_dir/.fused-llm-build.lock`` (another build of the
    same directory waits for it; the kernel drops it when the holder dies) and, holding it,
    removes ``cpp_extension.load``'s own ``lock`` file. That one is a plain file: a build killed
    mid-way (a ``timeout`` on the GPU machine) leaves it, and every later ``load`` of the
    directory waits on it forever. Under our flock no live build of ours can own it."""
    import fcntl

    with open(build_dir / ".fused-llm-build.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            (build_dir / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def _compiler_errors(log: list[str]) -> str:
    """The compiler's error lines (they name file:line) with a little context, else the tail."""
    text = "".join(log)
    lines = text.splitlines()
    keep = [i for i, line in enumerate(lines) if re.search(r"\berror\b|Error|FAILED", line)]
    if not keep:
        return "\n".join(lines[-60:])
    shown: list[str] = []
    for i in keep[:30]:
        for line in lines[max(0, i - 1) : i + 3]:
            if line not in shown[-4:]:
                shown.append(line)
    return "\n".join(shown)


def _compile_job_main(job_file: str) -> None:
    """Child-process side: ``cpp_extension.load`` (ninja). An unchanged package rebuilds
    nothing; a change recompiles the package, since the unique id it passes to every object
    as ``-DTORCH_EXTENSION_NAME`` hashes every source."""
    from torch.utils import cpp_extension

    job = json.loads(Path(job_file).read_text())
    cpp_extension.load(
        name=job["name"],
        sources=job["sources"],
        extra_cflags=job["cflags"],
        extra_cuda_cflags=job["cuda_cflags"],
        extra_include_paths=job["include_dirs"],
        build_directory=job["build_dir"],
        with_cuda=job["with_cuda"],
        is_python_module=False,
        verbose=True,
    )


# ---------------------------------------------------------------------------------------
# Building a package
# ---------------------------------------------------------------------------------------


@dataclass
class BuildResult:
    package: str
    variant_dir: Path
    kernel_id: str
    archs: list[str] | None
    up_to_date: bool = False  # build/ already held exactly this variant: nothing was written


def build_package(
    pkg_dir: Path,
    backend: str = "auto",
    *,
    clean: bool = False,
    capabilities: Sequence[str] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[BuildResult]:
    """Build one package for ``backend`` (``auto`` = the running torch's, or cpu with a
    ``BuildWarning`` when that is cuda and nvcc is missing). ``capabilities`` narrows the
    build.toml list further (e.g. ``["8.0"]`` to run the sm80 path on a Hopper)."""
    config = load_config(pkg_dir)
    if clean:
        shutil.rmtree(config.path / "build", ignore_errors=True)
        shutil.rmtree(config.path / CACHE_DIR, ignore_errors=True)
    if config.noarch:
        return _build_noarch(config)
    running = torch_backend()
    chosen = running if backend == "auto" else backend
    if chosen not in BACKENDS:
        raise BuildError(f"--backend must be one of auto, {', '.join(BACKENDS)} (got {backend!r})")
    if backend == "auto" and chosen == "cuda" and "cpu" in config.backends:
        try:
            find_nvcc()
        except BuildError as err:
            warnings.warn(
                f"{config.name}: torch is a CUDA build but nvcc is missing, so --backend auto builds "
                f"the cpu backend instead ({err}). Install the CUDA toolkit for the cuda variant.",
                BuildWarning,
                stacklevel=2,
            )
            chosen = "cpu"
    if chosen not in config.backends:
        raise BuildError(f"{config.path / 'build.toml'}: backend {chosen!r} is not in [general] backends {list(config.backends)}")
    if chosen != "cpu" and chosen != running:
        raise BuildError(f"cannot build the {chosen} backend with a {running} build of torch")
    return [_build_arch(config, chosen, capabilities, on_progress)]


# Object files and staging, per package: outside build/, which holds only variant directories.
CACHE_DIR = ".build-cache"


def cuda_capabilities_for(config: BuildConfig, sections: Iterable[KernelSection], available: Sequence[str], capabilities: Sequence[str] | None) -> list[str]:
    """The capabilities one build of ``sections`` targets: each section's ``cuda-capabilities``
    (all the toolkit's without the key) ∩ toolkit, then narrowed by ``--capabilities``."""
    caps: list[str] = []
    for k in sections:
        requested, source = section_capabilities(k, available)
        selected = select_capabilities(requested, available, f"{config.path / 'build.toml'} [kernel.{k.name}]", source)
        caps += [c for c in selected if c not in caps]
    return narrow_capabilities(caps, capabilities, f"{config.name} (cuda)")


def _build_arch(config: BuildConfig, backend: str, capabilities: Sequence[str] | None, on_progress) -> BuildResult:
    # A backend listed in [general] backends with no [kernel.*] section builds the [torch]
    # sources alone, as kernel-builder's generated CMake does (the binding is compiled for every
    # backend, each kernel section only for its own). gated-mlp relies on it: its compiled
    # kernel is CUDA-only, while its cpu and rocm builds still need the binding's .so for the
    # op namespace its Python custom ops (plain torch / Triton) are registered in.
    sections = config.kernels_for(backend)
    if not sections and not any(s.endswith((".cpp", ".cc", ".cu")) for s in config.torch_src):
        raise BuildError(
            f"{config.path / 'build.toml'}: backend {backend!r} has no [kernel.*] section and [torch] src "
            f"compiles nothing: list the torch binding there, or use [torch-noarch] for a Python-only package"
        )
    variant = arch_variant_name(backend)
    build_root = config.path / "build"
    cache_root = config.path / CACHE_DIR
    obj_dir = cache_root / variant
    gen_dir = obj_dir / "generated"
    gen_dir.mkdir(parents=True, exist_ok=True)
    for header, text in (("registration.h", REGISTRATION_H), (GLIBC_COMPAT_NAME, GLIBC_COMPAT_H), (GLIBCXX_COMPAT_NAME, GLIBCXX_COMPAT_CPP)):
        if not (gen_dir / header).is_file() or (gen_dir / header).read_text() != text:
            (gen_dir / header).write_text(text)
    compat = ["-include", str(gen_dir / GLIBC_COMPAT_NAME)]

    compiled = [s for s in config.torch_src if s.endswith((".cpp", ".cc", ".cu"))]
    cuda_flags: list[str] = []
    archs: list[str] | None = None
    for k in sections:
        compiled += [s for s in k.src if s.endswith((".cpp", ".cc", ".cu"))]
    compiled.append(str(gen_dir / GLIBCXX_COMPAT_NAME))  # absolute: config.path / abs == abs
    # No -std here: torch's cpp_extension passes its own minimum (c++20 for torch 2.13) and a
    # later -std of ours would override it.
    cflags = ["-O3", PY_LIMITED_API, *compat, *BACKEND_DEFINES[backend], *config.torch_cxx_flags]
    for k in sections:
        cflags += list(k.cxx_flags)
    if backend == "cuda":
        caps = cuda_capabilities_for(config, sections, toolkit_capabilities(find_nvcc()), capabilities)
        gencode, archs = gencode_flags(caps)
        cuda_flags = ["-O3", *compat, *BACKEND_DEFINES[backend], *gencode]
        for k in sections:
            cuda_flags += list(k.cuda_flags)
    elif backend == "rocm":
        raise BuildError("the rocm backend is built by kernel-builder (hipify + hipcc); fused-llm build supports cpu and cuda")

    kernel_id = unique_id(config, backend, archs or ())
    job = CompileJob(
        name=kernel_id,
        sources=[str(config.path / s) for s in dict.fromkeys(compiled)],
        build_dir=str(obj_dir),
        include_dirs=[str(gen_dir), *include_dirs(config, sections)],
        cflags=cflags,
        cuda_cflags=cuda_flags,
        with_cuda=backend == "cuda",
    )
    so = job.run(on_progress)

    variant_dir = build_root / variant

    def fill(staging: Path) -> None:
        copy_python_package(config, staging)
        (staging / "_ops.py").write_text(OPS_PY_ARCH.format(id=kernel_id))
        shutil.copy2(so, staging / f"{kernel_id}.abi3.so")
        write_metadata(staging, config, kernel_id, backend, archs)

    up_to_date = _install_variant(variant_dir, cache_root, fill)
    _remove_stale_variants(build_root, keep_noarch=False)
    return BuildResult(config.name, variant_dir, kernel_id, archs, up_to_date)


def _install_variant(variant_dir: Path, cache_root: Path, fill: Callable[[Path], None]) -> bool:
    """Write a variant through a staging directory that ``fill`` populates, then move it to
    ``variant_dir``, unless ``variant_dir`` already holds the same files with the same bytes:
    then nothing is written and this returns True (the package was up to date)."""
    cache_root.mkdir(parents=True, exist_ok=True)
    # Staged next to the objects (same filesystem as build/, so the rename is atomic).
    staging = Path(tempfile.mkdtemp(prefix=f"staging-{variant_dir.name}-", dir=cache_root))
    try:
        staging.chmod(0o755)  # mkdtemp makes it 0700
        fill(staging)
        if _same_files(staging, variant_dir):
            return True
        variant_dir.parent.mkdir(exist_ok=True)
        shutil.rmtree(variant_dir, ignore_errors=True)
        staging.rename(variant_dir)
        return False
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _same_files(a: Path, b: Path) -> bool:
    """Whether directories ``a`` and ``b`` hold the same files with the same contents (the
    ``__pycache__`` that loading a variant leaves in it aside)."""

    def files(root: Path) -> list[Path]:
        return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)

    if not b.is_dir() or files(a) != files(b):
        return False
    return all(filecmp.cmp(a / p, b / p, shallow=False) for p in files(a))


NOARCH_VARIANT = re.compile(r"torch-(universal|cpu|cuda|rocm|xpu|metal|npu|neuron|tpu)")


def _remove_stale_variants(build_root: Path, keep_noarch: bool) -> None:
    """Drop the variant directories of the other framework kind: a package that moved between
    ``[torch-noarch]`` and ``[torch]`` would otherwise keep its old variants in build/, where
    the loader may still choose them (it prefers arch over noarch) and an upload would take
    them. Arch variants of other torch / toolkit versions are kept (a Hub upload gathers
    several)."""
    if not build_root.is_dir():
        return
    for entry in build_root.iterdir():
        if entry.is_dir() and bool(NOARCH_VARIANT.fullmatch(entry.name)) != keep_noarch:
            shutil.rmtree(entry, ignore_errors=True)


def _build_noarch(config: BuildConfig) -> list[BuildResult]:
    _remove_stale_variants(config.path / "build", keep_noarch=True)
    results = []
    for backend in config.backends:
        kernel_id = unique_id(config, backend)
        archs = {"cuda": list(config.noarch_cuda_capabilities), "rocm": list(config.noarch_rocm_archs)}.get(backend) or None
        variant_dir = config.path / "build" / f"torch-{backend}"
        uid = kernel_id.removeprefix(f"_{config.python_name}_{backend}_")

        def fill(staging: Path, kernel_id=kernel_id, backend=backend, archs=archs, uid=uid) -> None:
            copy_python_package(config, staging)
            (staging / "_ops.py").write_text(OPS_PY_NOARCH.format(py=config.python_name, uid=uid))
            write_metadata(staging, config, kernel_id, backend, archs)

        up_to_date = _install_variant(variant_dir, config.path / CACHE_DIR, fill)
        results.append(BuildResult(config.name, variant_dir, kernel_id, archs, up_to_date))
    return results


# ---------------------------------------------------------------------------------------
# --check-cuda: framework-free CUDA sources through nvcc, no torch, no GPU
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CudaCheck:
    package: str
    source: Path
    capability: str
    command: list[str]


def cuda_checks(pkg_dirs: Iterable[Path]) -> list[CudaCheck]:
    """One nvcc compile per framework-free ``.cu`` and capability of every cuda section."""
    nvcc = find_nvcc()
    available = toolkit_capabilities(nvcc)
    checks = []
    for pkg_dir in pkg_dirs:
        config = load_config(pkg_dir)
        for k in config.kernels_for("cuda"):
            requested, source = section_capabilities(k, available)
            caps = select_capabilities(requested, available, f"{config.path / 'build.toml'} [kernel.{k.name}]", source)
            incs = [f"-I{d}" for d in include_dirs(config, [k])]
            for src in (s for s in k.src if s.endswith(".cu")):
                for cap in caps:
                    num = cap.replace(".", "")
                    # Explicit -std: no torch flags here, these sources are framework-free.
                    cmd = [nvcc, "-std=c++17", "-O3", "-c", "-o", os.devnull, *BACKEND_DEFINES["cuda"],
                           f"-gencode=arch=compute_{num},code=sm_{num}", *k.cuda_flags, *incs,
                           str(config.path / src)]
                    checks.append(CudaCheck(config.name, config.path / src, cap, cmd))
    return checks


def run_cuda_check(check: CudaCheck) -> str | None:
    """None on success, else the compiler's errors."""
    proc = subprocess.run(check.command, capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    return _compiler_errors((proc.stdout + proc.stderr).splitlines(keepends=True))


def check_cuda(pkg_dirs: Iterable[Path], jobs: int | None = None, on_done: Callable[[CudaCheck, str | None], None] | None = None) -> list[tuple[CudaCheck, str]]:
    """Compile-check every CUDA source; returns the failures."""
    checks = cuda_checks(pkg_dirs)
    failures = []
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 2) as pool:
        for check, error in zip(checks, pool.map(run_cuda_check, checks)):
            if on_done:
                on_done(check, error)
            if error:
                failures.append((check, error))
    return failures


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--compile-job":
        _compile_job_main(sys.argv[2])
    else:
        sys.exit("internal entry point: python -m fused_llm_dev.builder --compile-job JOB.json")
