"""Hub-shaped repositories of the packages, and a Hugging Face cache that holds them.

Users load our kernels with ``kernels.get_kernel("fused-llm/<pkg>", version=1)``, which reads
the Hub repository's branch ``v1`` through the Hugging Face cache. This module builds, for each
package, the repository ``kernel-builder upload`` would produce from ``PKG/build/`` (read from
kernel-builder's ``upload.rs``):

* a ``kernel`` repository whose ``main`` branch starts with ``.gitattributes`` (the Hub's repo
  creation), then gets ``README.md`` (the package's ``CARD.md``);
* branch ``v<version>`` (from ``main`` before the README, as upload creates it first), holding
  ``build/<variant>/…`` for every variant in ``PKG/build/`` and ``benchmarks/benchmark*.py``;
* ``.so`` files stored through Git LFS (the packages' ``.gitattributes`` rule; the Hub takes
  binaries only through LFS / Xet): a pointer in Git, the object under ``lfs/objects/``.

It is a bare Git repository written with ``git fast-import`` under a fixed author and date, so
the same files always give the same commit ids. ``install_in_hf_cache`` then lays a revision of
it into a cache directory the way ``huggingface_hub`` 2.x does when it downloads one
(``snapshot_download(repo_type="kernel", revision="v1")``): ``blobs/<etag>`` (the Git blob id,
or the LFS sha256), ``snapshots/<commit>/<path>`` as relative symlinks to the blobs,
``refs/<branch>`` holding the commit, ``trees/<commit>.json`` (the tree listing cache) and the
``.locks/`` and ``CACHEDIR.TAG`` it leaves behind. ``huggingface_hub.scan_cache_dir`` and
``get_cached_repo_tree`` read it back in tests/test_hub.py.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fused_llm import packages

MAIN = "main"
# One identity and time for every commit: content alone decides the commit ids.
_SIGNATURE = "fused-llm <fused-llm@users.noreply.huggingface.co> 0 +0000"
# Git LFS pointer format (git-lfs spec v1), and the size under which git-lfs looks for one.
_LFS_SPEC = "https://git-lfs.github.com/spec/v1"
_LFS_POINTER_MAX = 1024
_TREE_CACHE_FORMAT = 1  # huggingface_hub's trees/<commit>.json format_version


def branch_name(version: int = packages.HUB_VERSION) -> str:
    return f"v{version}"


# ---------------------------------------------------------------------------------------
# What an upload takes
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UploadPlan:
    """The files ``kernel-builder upload`` would commit, per branch, as repo path -> local file."""

    repo_id: str
    version: int
    initial: dict[str, Path]  # the repository's first commit on main (.gitattributes)
    readme: dict[str, Path]  # committed to main after the version branch was made
    version_files: dict[str, Path]  # committed to branch v<version> (made from the initial commit)
    variants: list[str]
    missing_backends: list[str]  # claimed in build.toml, no variant in build/


def _variant_dirs(build: Path) -> list[Path]:
    return sorted(d for d in build.iterdir() if d.is_dir() and (d / "metadata.json").is_file())


def upload_plan(pkg_dir: Path) -> UploadPlan:
    """Read ``pkg_dir/build.toml`` and ``pkg_dir/build/``; raise if there is nothing to upload."""
    import tomllib

    pkg_dir = Path(pkg_dir).resolve()
    general = tomllib.loads((pkg_dir / "build.toml").read_text())["general"]
    repo_id = general.get("hub", {}).get("repo-id") or packages.hub_repo_id(general["name"])
    build = pkg_dir / "build"
    variants = _variant_dirs(build) if build.is_dir() else []
    if not variants:
        raise FileNotFoundError(f"{build}: no variant to upload: run `fused-llm build {pkg_dir.name}` first")
    version_files: dict[str, Path] = {}
    covered: set[str] = set()
    for variant in variants:
        meta = json.loads((variant / "metadata.json").read_text())
        if meta.get("version") != general["version"]:
            raise ValueError(f"{variant}/metadata.json: version {meta.get('version')} != build.toml's {general['version']} (rebuild)")
        covered.add(meta["backend"]["type"])
        for path in sorted(variant.rglob("*")):
            # kernel-builder never ships bytecode, and kernels' downloads ignore it.
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                version_files[f"build/{variant.name}/{path.relative_to(variant).as_posix()}"] = path
    bench = pkg_dir / "benchmarks"
    if bench.is_dir():  # upload.rs: top-level benchmark*.py only
        for path in sorted(bench.glob("benchmark*.py")):
            version_files[f"benchmarks/{path.name}"] = path
    initial = {".gitattributes": pkg_dir / ".gitattributes"} if (pkg_dir / ".gitattributes").is_file() else {}
    readme = {"README.md": pkg_dir / "CARD.md"} if (pkg_dir / "CARD.md").is_file() else {}
    return UploadPlan(
        repo_id=repo_id,
        version=general["version"],
        initial=initial,
        readme=readme,
        version_files=version_files,
        variants=[v.name for v in variants],
        missing_backends=sorted(set(general["backends"]) - covered),
    )


# ---------------------------------------------------------------------------------------
# The repository
# ---------------------------------------------------------------------------------------


def _lfs_patterns(gitattributes: Path | None) -> list[str]:
    if gitattributes is None or not gitattributes.is_file():
        return []
    return [line.split()[0] for line in gitattributes.read_text().splitlines()
            if line.strip() and not line.startswith("#") and "filter=lfs" in line.split()[1:]]


def _is_lfs(repo_path: str, patterns: Sequence[str]) -> bool:
    # A pattern without a slash matches the file name at any depth (gitattributes rules).
    name = repo_path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(repo_path if "/" in p else name, p) for p in patterns)


def _lfs_pointer(data: bytes) -> tuple[bytes, str]:
    oid = hashlib.sha256(data).hexdigest()
    return f"version {_LFS_SPEC}\noid sha256:{oid}\nsize {len(data)}\n".encode(), oid


@dataclass(frozen=True)
class RepoEntry:
    """One file of a revision, with what the Hub's tree API reports for it."""

    path: str
    blob_id: str  # Git blob id (of the pointer, for LFS files)
    size: int  # the file's size (the LFS object's for LFS files)
    lfs_sha256: str | None
    data: bytes

    @property
    def etag(self) -> str:
        """What the Hub sends as the file's ETag, and so its blob name in the cache."""
        return self.lfs_sha256 or self.blob_id


@dataclass(frozen=True)
class HubRepo:
    """A bare Git repository shaped like the package's Hub repository."""

    git_dir: Path
    repo_id: str
    branch: str

    def _git(self, *args: str, input: bytes | None = None) -> bytes:
        proc = subprocess.run(["git", "--git-dir", str(self.git_dir), *args], input=input, capture_output=True)
        if proc.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed in {self.git_dir}: {proc.stderr.decode().strip()}")
        return proc.stdout

    def commit(self, revision: str | None = None) -> str:
        return self._git("rev-parse", "--verify", f"{revision or self.branch}^{{commit}}").decode().strip()

    def entries(self, revision: str | None = None) -> list[RepoEntry]:
        """Every file of ``revision`` (default: the version branch), LFS objects resolved."""
        listing = self._git("ls-tree", "-r", "-l", "--full-tree", "-z", self.commit(revision)).split(b"\0")
        rows = []
        for line in filter(None, listing):
            meta, path = line.split(b"\t", 1)
            _mode, kind, oid, _size = meta.split()
            if kind == b"blob":
                rows.append((path.decode(), oid.decode()))
        out = self._git("cat-file", "--batch", input="".join(f"{oid}\n" for _, oid in rows).encode())
        entries, pos = [], 0
        for path, oid in rows:
            header_end = out.index(b"\n", pos)
            size = int(out[pos:header_end].split()[2])
            data = out[header_end + 1 : header_end + 1 + size]
            pos = header_end + 1 + size + 1
            lfs = None
            if size < _LFS_POINTER_MAX and data.startswith(f"version {_LFS_SPEC}\n".encode()):
                fields = dict(line.split(" ", 1) for line in data.decode().splitlines())
                lfs = fields["oid"].removeprefix("sha256:")
                data = (self.git_dir / "lfs" / "objects" / lfs[:2] / lfs[2:4] / lfs).read_bytes()
                if hashlib.sha256(data).hexdigest() != lfs or len(data) != int(fields["size"]):
                    raise RuntimeError(f"{self.git_dir}: LFS object {lfs} of {path} does not match its pointer")
            entries.append(RepoEntry(path, oid, len(data), lfs, data))
        return entries


def write_hub_repo(pkg_dir: Path, dest: Path) -> HubRepo:
    """Write the package's Hub-shaped repository to ``dest`` (a bare Git repository, replaced
    if it exists) from ``pkg_dir/build/``; see the module docstring for its shape."""
    plan = upload_plan(pkg_dir)
    dest = Path(dest)
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", "--bare", "--initial-branch", MAIN, str(dest)], check=True)
    patterns = _lfs_patterns(plan.initial.get(".gitattributes"))
    stream = bytearray()

    def commit(ref: str, message: str, files: dict[str, Path], *, mark: int | None = None, parent: str | None = None) -> None:
        # fast-import continues a branch it already wrote from its tip; `parent` starts a new one.
        msg = message.encode()
        stream.extend(f"commit {ref}\n".encode() + (f"mark :{mark}\n".encode() if mark else b""))
        stream.extend(f"author {_SIGNATURE}\ncommitter {_SIGNATURE}\ndata {len(msg)}\n".encode() + msg + b"\n")
        if parent:
            stream.extend(f"from {parent}\n".encode())
        for repo_path, local in sorted(files.items()):
            data = local.read_bytes()
            if _is_lfs(repo_path, patterns):
                data, oid = _lfs_pointer(data)
                obj = dest / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
                obj.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(local, obj)
            stream.extend(f"M 100644 inline {repo_path}\ndata {len(data)}\n".encode() + data + b"\n")

    branch = branch_name(plan.version)
    # The Hub's repo creation, upload.rs's branch (made from main), then its two commits.
    commit(f"refs/heads/{MAIN}", "initial commit", plan.initial, mark=1)
    commit(f"refs/heads/{branch}", f"Upload {', '.join(plan.variants)}", plan.version_files, parent=":1")
    if plan.readme:
        commit(f"refs/heads/{MAIN}", "Upload README.md", plan.readme)
    proc = subprocess.run(["git", "--git-dir", str(dest), "fast-import", "--quiet"], input=bytes(stream), capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"git fast-import failed for {dest}: {proc.stderr.decode().strip()}")
    return HubRepo(dest, plan.repo_id, branch)


# ---------------------------------------------------------------------------------------
# The Hugging Face cache
# ---------------------------------------------------------------------------------------


def repo_folder(repo_id: str, repo_type: str = "kernel") -> str:
    """``kernels--fused-llm--rmsnorm-fp8``: huggingface_hub's folder name for a repository."""
    return "--".join([f"{repo_type}s", *repo_id.split("/")])


def _select(paths: Iterable[str], allow_patterns: Sequence[str] | None) -> list[str]:
    # huggingface_hub's filter_repo_objects: fnmatchcase, '*' crosses '/'.
    return [p for p in paths if allow_patterns is None or any(fnmatch.fnmatchcase(p, pat) for pat in allow_patterns)]


def install_in_hf_cache(
    repo: HubRepo,
    cache_dir: Path,
    *,
    revision: str | None = None,
    repo_type: str = "kernel",
    allow_patterns: Sequence[str] | None = None,
    write_ref: bool = True,
) -> Path:
    """Lay ``revision`` (default: the version branch) of ``repo`` into ``cache_dir`` (the
    ``HF_HUB_CACHE``) as ``snapshot_download(repo_id, repo_type=repo_type, revision=…,
    allow_patterns=…)`` leaves it, and return the snapshot folder.

    ``write_ref=False`` leaves no ``refs/<branch>``, as when the download named the commit
    (what ``kernels.get_kernel(version=1)`` does online after resolving the branch)."""
    revision = revision or repo.branch
    commit = repo.commit(revision)
    entries = repo.entries(commit)
    cache_dir = Path(cache_dir)
    storage = cache_dir / repo_folder(repo.repo_id, repo_type)
    locks = cache_dir / ".locks" / repo_folder(repo.repo_id, repo_type)
    snapshot = storage / "snapshots" / commit
    for folder in (storage / "blobs", snapshot, locks):
        folder.mkdir(parents=True, exist_ok=True)
    tag = cache_dir / "CACHEDIR.TAG"
    if not tag.exists():  # the Cache Directory Tagging Standard's signature line
        tag.write_text("Signature: 8a477f597d28d172789f06886806bc55\n# The Hugging Face Hub cache (written by fused-llm hub)\n")
    # The tree listing holds every file of the commit, whatever the patterns downloaded.
    tree = {e.path: {"size": e.size, "blob_id": e.blob_id, **({"lfs_sha256": e.lfs_sha256, "lfs_size": e.size} if e.lfs_sha256 else {})}
            for e in entries}
    (storage / "trees").mkdir(exist_ok=True)
    (storage / "trees" / f"{commit}.json").write_text(json.dumps({"format_version": _TREE_CACHE_FORMAT, "files": dict(sorted(tree.items()))}, indent=1))
    by_path = {e.path: e for e in entries}
    for path in _select(by_path, allow_patterns):
        entry = by_path[path]
        blob = storage / "blobs" / entry.etag
        if not blob.exists():
            tmp = blob.with_name(blob.name + ".incomplete")
            tmp.write_bytes(entry.data)
            os.replace(tmp, blob)
        (locks / f"{entry.etag}.lock").touch()
        pointer = snapshot / path
        pointer.parent.mkdir(parents=True, exist_ok=True)
        if pointer.is_symlink() or pointer.exists():
            pointer.unlink()
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    if write_ref and revision != commit:
        (storage / "refs").mkdir(exist_ok=True)
        (storage / "refs" / revision).write_text(commit)  # no newline, as huggingface_hub writes it
    return snapshot


def install_packages(names: Sequence[str], repos_dir: Path, cache_dir: Path, repo_types: Sequence[str] = ("kernel",)) -> dict[str, Path]:
    """Hub repositories of ``names`` under ``repos_dir`` and their version branch in the cache,
    as each ``repo_type`` (``kernels benchmark`` of kernels 0.17.2 downloads as a model repo);
    returns the kernel snapshot of each package."""
    snapshots = {}
    for name in names:
        repo = write_hub_repo(packages.package_dir(name), Path(repos_dir) / f"{name}.git")
        for repo_type in repo_types:
            snapshot = install_in_hf_cache(repo, cache_dir, repo_type=repo_type)
            snapshots.setdefault(name, snapshot)
    return snapshots
