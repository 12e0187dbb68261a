"""``fused-llm sync``: stamp the shared sources of ``common/`` into the packages that use them.

kernel-builder builds a package from its own directory alone, and a package's tests must run
with only that package on the path, so code shared between packages (device headers, binding
helpers, test helpers) cannot be included from outside the package. It lives once in
``common/`` and is copied ("stamped") into each package that uses it, as a generated file
whose first line says where it comes from::

    // generated from common/csrc/numerics.h by `fused-llm sync`, do not edit

``common/manifest.toml`` says which file goes where. Each ``[[stamp]]`` table names
``files`` (paths relative to ``common/``) and either ``into`` (directories relative to the
repository root: each file keeps its name) or ``to`` (file paths relative to the root, for a
single file stamped under per-package names).

``fused-llm sync`` writes every stamped copy that differs from its source and names the stale
ones (files that carry the header but that the manifest does not list: a copy whose entry was
removed, or one written by hand before its entry was added); ``--prune`` deletes those.
``fused-llm sync --check`` changes nothing and exits 1 naming every copy that differs from its
source, is missing or is stale, every file of ``common/`` that the manifest does not stamp,
and every stamped C/C++ header that a build.toml section compiles (through ``#include "..."``)
without listing it in that section's ``src`` (kernel-builder hipifies and tracks only listed
files). ``tests/test_sync.py`` runs the check, so CI fails on drift.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

COMMON_DIR = "common"
MANIFEST = "manifest.toml"
# Files of common/ that are not stamped anywhere by design.
UNSTAMPED = {MANIFEST, "README.md"}

# Comment syntax of the first line, by file suffix.
COMMENT = {".h": "//", ".cuh": "//", ".cu": "//", ".cpp": "//", ".cc": "//", ".py": "#"}
HEADER = "{comment} generated from {source} by `fused-llm sync`, do not edit\n"
HEADER_RE = re.compile(r"^(?://|#) generated from (common/\S+) by `fused-llm sync`, do not edit$")

C_SUFFIXES = (".h", ".cuh", ".cu", ".cpp", ".cc")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


class SyncError(RuntimeError):
    """The manifest is malformed or names a file that does not exist."""


@dataclass(frozen=True)
class Stamp:
    source: Path  # the file under common/
    dest: Path  # the stamped copy

    def expected(self, root: Path) -> str:
        """The stamped copy's exact text: the header line, then the source unchanged."""
        comment = COMMENT[self.source.suffix]
        header = HEADER.format(comment=comment, source=self.source.relative_to(root).as_posix())
        return header + self.source.read_text()


@dataclass(frozen=True)
class Problem:
    path: Path
    what: str

    def describe(self, root: Path) -> str:
        return f"{self.path.relative_to(root).as_posix()}: {self.what}"


def load_manifest(root: Path) -> list[Stamp]:
    """Every (source, destination) pair ``common/manifest.toml`` names, validated."""
    common = root / COMMON_DIR
    manifest = common / MANIFEST
    if not manifest.is_file():
        raise SyncError(f"{manifest}: no such file (it lists which file of common/ goes where)")
    try:
        data = tomllib.loads(manifest.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SyncError(f"{manifest}: {err}") from None
    stamps: list[Stamp] = []
    for i, table in enumerate(data.get("stamp", []), 1):
        where = f"{manifest}: [[stamp]] #{i}"
        unknown = set(table) - {"files", "into", "to"}
        if unknown:
            raise SyncError(f"{where}: unknown key(s) {sorted(unknown)} (keys: files, into, to)")
        files = table.get("files") or []
        if not files:
            raise SyncError(f"{where}: `files` must list at least one path under common/")
        if ("into" in table) == ("to" in table):
            raise SyncError(f"{where}: give exactly one of `into` (directories) or `to` (file paths)")
        if "to" in table and len(files) != 1:
            raise SyncError(f"{where}: `to` names file paths, so `files` must hold exactly one file")
        for rel in files:
            source = common / rel
            if not source.is_file():
                raise SyncError(f"{where}: common/{rel} does not exist")
            if source.suffix not in COMMENT:
                raise SyncError(f"{where}: common/{rel}: no comment syntax known for {source.suffix!r} files")
            dests = [root / d / source.name for d in table["into"]] if "into" in table else [root / d for d in table["to"]]
            for dest in dests:
                if dest.suffix != source.suffix:
                    raise SyncError(f"{where}: {dest.relative_to(root)} must keep the suffix of common/{rel}")
                if common in dest.parents:
                    raise SyncError(f"{where}: {dest.relative_to(root)} is inside common/")
                stamps.append(Stamp(source, dest))
    seen: dict[Path, Path] = {}
    for s in stamps:
        if s.dest in seen and seen[s.dest] != s.source:
            raise SyncError(f"{manifest}: {s.dest.relative_to(root)} is stamped from both {seen[s.dest].name} and {s.source.name}")
        seen[s.dest] = s.source
    return list({s.dest: s for s in stamps}.values())


def _repo_files(root: Path) -> list[Path]:
    """Files of the checkout: tracked plus untracked-but-not-ignored (so build outputs are
    skipped); without git, every file outside build/ and .build-cache/ directories."""
    try:
        proc = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                              capture_output=True, check=True)
        return [root / p for p in proc.stdout.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        skip = {"build", ".build-cache", ".git", "__pycache__"}
        return [p for p in root.rglob("*") if p.is_file() and not skip & set(p.relative_to(root).parts)]


def stamped_files(root: Path) -> list[Path]:
    """Files of the checkout (outside common/) whose first line is the generated-file header."""
    found = []
    for path in _repo_files(root):
        if path.suffix not in COMMENT or not path.is_file() or path.parts[len(root.parts)] == COMMON_DIR:
            continue
        with path.open(encoding="utf-8", errors="replace") as f:
            if HEADER_RE.match(f.readline().rstrip("\n")):
                found.append(path)
    return found


def sync(root: Path, prune: bool = False) -> tuple[list[Path], list[Path]]:
    """Write every stamped copy that differs. Returns (written, stale); the stale copies are
    deleted only with ``prune``: a file with the header that the manifest does not list may be
    a colleague's new shared file whose entry is still to be added."""
    stamps = load_manifest(root)
    written = []
    for s in stamps:
        text = s.expected(root)
        if not s.dest.is_file() or s.dest.read_text() != text:
            s.dest.parent.mkdir(parents=True, exist_ok=True)
            s.dest.write_text(text)
            written.append(s.dest)
    dests = {s.dest for s in stamps}
    stale = [p for p in stamped_files(root) if p not in dests]
    if prune:
        for p in stale:
            p.unlink()
    return written, stale


def check(root: Path) -> list[Problem]:
    """Everything ``sync`` would change, plus the manifest and build.toml gaps (module doc)."""
    stamps = load_manifest(root)
    problems = []
    for s in stamps:
        source = s.source.relative_to(root).as_posix()
        if not s.dest.is_file():
            problems.append(Problem(s.dest, f"missing (stamped from {source}): run `fused-llm sync`"))
        elif s.dest.read_text() != s.expected(root):
            problems.append(Problem(s.dest, f"differs from {source}: edit {source} and run `fused-llm sync`"))
    dests = {s.dest for s in stamps}
    for p in stamped_files(root):
        if p not in dests:
            problems.append(Problem(p, "stale stamped copy (not in common/manifest.toml): add its entry, or `fused-llm sync --prune`"))
    stamped_sources = {s.source for s in stamps}
    common = root / COMMON_DIR
    for p in sorted(common.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.name not in UNSTAMPED and p not in stamped_sources:
            problems.append(Problem(p, "not stamped anywhere: add it to common/manifest.toml"))
    problems += check_build_sources(root, dests)
    return problems


def _include_closure(start: list[Path], include_dirs: list[Path], pkg: Path) -> set[Path]:
    """Files of ``pkg`` reached from ``start`` through ``#include "..."`` (resolved next to the
    including file first, then in ``include_dirs``, as the compilers do)."""
    seen: set[Path] = set()
    todo = [p for p in start if p.is_file()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in INCLUDE_RE.findall(path.read_text(errors="replace")):
            for base in (path.parent, *include_dirs):
                cand = (base / name).resolve()
                if cand.is_file():
                    if pkg in cand.parents:
                        todo.append(cand)
                    break
    return seen


def check_build_sources(root: Path, dests: set[Path]) -> list[Problem]:
    """Every stamped C/C++ file that a build.toml section compiles must be in its ``src``."""
    problems = []
    stamped = {d.resolve() for d in dests}
    for toml_path in sorted(root.glob("*/build.toml")):
        pkg = toml_path.parent.resolve()
        data = tomllib.loads(toml_path.read_text())
        sections = []
        if "torch" in data:
            sections.append(("[torch]", data["torch"]))
        sections += [(f"[kernel.{name}]", table) for name, table in data.get("kernel", {}).items()]
        torch_include = [pkg / d for d in data.get("torch", {}).get("include", [])]
        for label, table in sections:
            src = {(pkg / s).resolve() for s in table.get("src", [])}
            incs = [pkg / d for d in table.get("include", [])] + torch_include
            reached = _include_closure([s for s in src if s.suffix in C_SUFFIXES], incs, pkg)
            for path in sorted(reached - src):
                if path in stamped:
                    rel = path.relative_to(pkg).as_posix()
                    problems.append(Problem(toml_path, f"{label} compiles the stamped {rel} but its src does not list it"))
    return problems
