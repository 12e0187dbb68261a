#!/usr/bin/env python3
"""Compare the SASS of the packages' CUDA kernels between a git revision and the working tree.

For every ``.cu`` of every cuda ``[kernel.*]`` section (or of the packages named), both versions
of the package directory are compiled with nvcc to cubins, with the flags ``fused-llm build``
uses, for each capability of the section (plus ``--extra-arch``), then disassembled with
``cuobjdump -sass``. Kernels are paired by name without namespaces (a type that moved into
another namespace renames every kernel that takes it; that alone is not a code change) and
compared instruction by instruction, addresses and encodings left out, together with their
register / shared / local / stack usage. Exits 1 when any kernel differs, is missing or is new.

Two flag sets (``--flags``):
  build   what ``fused-llm build`` passes through torch.utils.cpp_extension for the device
          code: -O3 -DCUDA_KERNEL -DUSE_CUDA, cpp_extension's COMMON_NVCC_FLAGS
          (-D__CUDA_NO_HALF_OPERATORS__ ... --expt-relaxed-constexpr), -std=c++20, the section's
          cuda-flags and include dirs (torch headers aside: the .cu files do not include them);
  check   the ``fused-llm build --check-cuda`` command (-std=c++17 -O3 -DCUDA_KERNEL -DUSE_CUDA).

    python tools/sass_diff.py                        # main vs working tree, both flag sets
    python tools/sass_diff.py --base HEAD~1 rmsnorm-fp8 --extra-arch 9.0a --flags build

A package whose C/C++ files are byte-identical at both revisions is reported and skipped.
cuobjdump comes from $CUDA_HOME/bin, PATH, or the copy Triton bundles.
"""

from __future__ import annotations

import argparse
import collections
import difflib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "torch-ext"), str(ROOT / "tools")]

from fused_llm import packages  # noqa: E402
from fused_llm_dev import builder  # noqa: E402

C_SUFFIXES = (".h", ".cuh", ".cu", ".cpp", ".cc", ".hpp")
# cpp_extension's device-code flags (torch.utils.cpp_extension.COMMON_NVCC_FLAGS, torch 2.13);
# read from torch when it is importable, so the comparison follows the installed version.
FALLBACK_COMMON_NVCC_FLAGS = [
    "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr",
]


def common_nvcc_flags() -> list[str]:
    try:
        from torch.utils.cpp_extension import COMMON_NVCC_FLAGS
    except ImportError:
        return FALLBACK_COMMON_NVCC_FLAGS
    return list(COMMON_NVCC_FLAGS)


def find_cuobjdump() -> str:
    cands = []
    if os.environ.get("CUDA_HOME"):
        cands.append(Path(os.environ["CUDA_HOME"]) / "bin" / "cuobjdump")
    if shutil.which("cuobjdump"):
        cands.append(Path(shutil.which("cuobjdump")))
    cands.append(Path("/usr/local/cuda/bin/cuobjdump"))
    try:
        import triton

        cands.append(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
    except ImportError:
        pass
    for c in cands:
        if c.is_file():
            return str(c)
    sys.exit("cuobjdump not found ($CUDA_HOME/bin, PATH, /usr/local/cuda/bin, triton's bundled copy)")


def extract_revision(rev: str, pkg: str, dest: Path) -> Path:
    """The package directory as of ``rev`` (git archive), under ``dest``."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "--", pkg],
                          capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest / pkg


def c_sources(pkg_dir: Path) -> dict[str, bytes]:
    skip = {"build", ".build-cache"}
    return {p.relative_to(pkg_dir).as_posix(): p.read_bytes() for p in sorted(pkg_dir.rglob("*"))
            if p.is_file() and p.suffix in C_SUFFIXES and not skip & set(p.relative_to(pkg_dir).parts)}


def compile_commands(pkg_dir: Path, flagset: str, extra_archs: list[str], out_dir: Path) -> list[tuple[str, str, list[str], Path]]:
    """(source, capability, nvcc command, cubin) for every .cu of the cuda sections."""
    nvcc = builder.find_nvcc()
    available = builder.toolkit_capabilities(nvcc)
    config = builder.load_config(pkg_dir)
    jobs = []
    for k in config.kernels_for("cuda"):
        requested, source = builder.section_capabilities(k, available)
        caps = builder.select_capabilities(requested, available, str(pkg_dir / "build.toml"), source)
        caps += [c for c in extra_archs if c not in caps and c.rstrip("af") in available]
        incs = [f"-I{d}" for d in builder.include_dirs(config, [k])]
        for src in (s for s in k.src if s.endswith(".cu")):
            for cap in caps:
                num = cap.replace(".", "")
                cubin = out_dir / f"{Path(src).stem}.sm_{num}.{flagset}.cubin"
                if flagset == "build":
                    flags = ["-O3", *builder.BACKEND_DEFINES["cuda"], *common_nvcc_flags(), *k.cuda_flags, "-std=c++20"]
                else:
                    flags = ["-std=c++17", "-O3", *builder.BACKEND_DEFINES["cuda"], *k.cuda_flags]
                cmd = [nvcc, *flags, "-cubin", f"-gencode=arch=compute_{num},code=sm_{num}", *incs,
                       "-o", str(cubin), str(pkg_dir / src)]
                jobs.append((src, cap, cmd, cubin))
    return jobs


FUNC_RE = re.compile(r"^\s*Function : (\S+)")
ADDR_RE = re.compile(r"/\*[0-9a-f]{4,}\*/")
ENC_RE = re.compile(r"/\* 0x[0-9a-f]+ \*/")
RES_RE = re.compile(r"Function (\S+):\s*(.*)")


def demangle(names: list[str]) -> dict[str, str]:
    """Mangled -> demangled without namespace qualifiers (fused_llm::, (anonymous namespace)::
    and the package's own)."""
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=False).stdout.splitlines()
    if len(out) != len(names):
        out = names
    strip = re.compile(r"(?:\(anonymous namespace\)|[A-Za-z_]\w*)::")
    return {m: strip.sub("", d) for m, d in zip(names, out)}


def disassemble(cuobjdump: str, cubin: Path) -> dict[str, list[str]]:
    """Kernel name (namespaces stripped) -> SASS lines (instructions only) + a resource line."""
    text = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    funcs: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = FUNC_RE.match(line)
        if m:
            current = m.group(1)
            funcs[current] = []
            continue
        if current is None:
            continue
        body = ENC_RE.sub("", ADDR_RE.sub("", line)).strip()
        if body and not body.startswith(".headerflags"):
            funcs[current].append(" ".join(body.split()))
    res = subprocess.run([cuobjdump, "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
    lines = res.splitlines()
    for i, line in enumerate(lines):
        m = RES_RE.match(line.strip())
        if m and m.group(1).rstrip(":") in funcs and i + 1 < len(lines):
            funcs[m.group(1).rstrip(":")].insert(0, "resources: " + " ".join(lines[i + 1].split()))
    names = demangle(list(funcs))
    return {names[k]: v for k, v in funcs.items()}


def opcode_delta(before: list[str], after: list[str]) -> dict[str, int]:
    """after - before, per opcode (guard predicates dropped): empty when the two kernels hold
    the same instructions in another order or with other registers."""
    def counts(lines: list[str]) -> collections.Counter:
        c: collections.Counter = collections.Counter()
        for line in lines:
            if line.startswith("resources:"):
                continue
            c[re.sub(r"^@!?U?P\w+\s+", "", line).split()[0].rstrip(";")] += 1
        return c
    b, a = counts(before), counts(after)
    return {op: a[op] - b[op] for op in sorted(set(a) | set(b)) if a[op] != b[op]}


def significant(op: str) -> bool:
    """Opcodes that touch memory or other threads, branch, convert or do floating-point math:
    a change in their count is more than scheduling or register allocation. HFMA2.MMA with zero
    operands is ptxas's way to zero or move a register, like MOV / CS2R / IMAD.MOV."""
    if op == "HFMA2.MMA":
        return False
    return bool(re.match(r"(LD|ST|ATOM|RED|SHFL|BAR|MEMBAR|BRA|EXIT|CALL|RET|F2|I2F|MUFU|H(ADD|MUL|FMA)2|F(ADD|MUL|FMA|MNMX|SETP|SEL))", op))


def run(cmd: list[str]) -> str | None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return None if proc.returncode == 0 else (proc.stdout + proc.stderr)[-4000:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("packages", nargs="*", help="package names (default: every package with a cuda section)")
    parser.add_argument("--base", default="main", help="git revision to compare against (default: main)")
    parser.add_argument("--extra-arch", default="", help="capabilities compiled besides the sections', e.g. 9.0a")
    parser.add_argument("--flags", choices=["build", "check", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--keep", help="keep the cubins and SASS listings in this directory")
    parser.add_argument("--show-diff", type=int, default=0, metavar="N", help="print N lines of each changed kernel's diff")
    args = parser.parse_args()

    names = args.packages or [n for n in packages.kernel_packages()
                              if builder.load_config(packages.package_dir(n)).kernels_for("cuda")]
    extra = [c.strip() for c in args.extra_arch.split(",") if c.strip()]
    flagsets = ["build", "check"] if args.flags == "both" else [args.flags]
    cuobjdump = find_cuobjdump()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="sass-diff-"))
    work.mkdir(parents=True, exist_ok=True)
    differences = 0
    try:
        for name in names:
            after_dir = packages.package_dir(name)
            before_dir = extract_revision(args.base, name, work / "before-tree")
            if c_sources(before_dir) == c_sources(after_dir):
                print(f"{name}: C/C++ sources identical to {args.base}: SASS unchanged by construction, not compiled")
                continue
            for flagset in flagsets:
                pairs = []
                for side, pkg_dir in (("before", before_dir), ("after", after_dir)):
                    out = work / name / side
                    out.mkdir(parents=True, exist_ok=True)
                    pairs.append(compile_commands(pkg_dir, flagset, extra, out))
                jobs = [j for side in pairs for j in side]
                with ThreadPoolExecutor(max_workers=args.jobs) as pool:
                    errors = list(pool.map(run, [cmd for _, _, cmd, _ in jobs]))
                for (src, cap, cmd, _), err in zip(jobs, errors):
                    if err:
                        print(f"{name}: {src} sm_{cap}: nvcc failed:\n{' '.join(cmd)}\n{err}")
                        return 2
                for (src, cap, _, cb), (_, _, _, ca) in zip(*pairs):
                    before, after = disassemble(cuobjdump, cb), disassemble(cuobjdump, ca)
                    if args.keep:
                        for side, funcs in (("before", before), ("after", after)):
                            (work / name / f"{Path(src).stem}.sm_{cap}.{flagset}.{side}.sass").write_text(
                                "".join(f"== {k}\n" + "\n".join(v) + "\n" for k, v in sorted(funcs.items())))
                    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
                    gone, new = sorted(before.keys() - after.keys()), sorted(after.keys() - before.keys())
                    instr = sum(len(v) - 1 for v in after.values())
                    label = f"{name}: {src} sm_{cap.replace('.', '')} [{flagset} flags]"
                    if not (changed or gone or new):
                        print(f"{label}: identical ({len(after)} kernels, {instr} instructions)")
                        continue
                    differences += 1
                    print(f"{label}: {len(changed)} changed, {len(gone)} gone, {len(new)} new of {len(before)} kernels")
                    for k in gone:
                        print(f"  gone: {k}")
                    for k in new:
                        print(f"  new:  {k}")
                    reordered = 0
                    for k in changed:
                        delta = opcode_delta(before[k], after[k])
                        res = "" if before[k][0] == after[k][0] else f"; {before[k][0]} -> {after[k][0]}"
                        sig = {op: n for op, n in delta.items() if significant(op)}
                        reordered += not delta and not res
                        what = ("same instructions, other order / registers" if not delta
                                else f"opcode counts {delta}" + (f", significant: {sig}" if sig else
                                                                 " (integer and move instructions only)"))
                        print(f"  changed: {k}: {len(before[k]) - 1} -> {len(after[k]) - 1} instructions, {what}{res}")
                        if args.show_diff:
                            diff = list(difflib.unified_diff(before[k], after[k], "before", "after", n=2, lineterm=""))
                            print("\n".join("    " + d for d in diff[: args.show_diff]))
                    print(f"  {reordered} of {len(changed)} changed kernels hold the same instructions (same resources)")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("SASS identical" if not differences else f"SASS differs in {differences} (source, arch, flags) combinations")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
