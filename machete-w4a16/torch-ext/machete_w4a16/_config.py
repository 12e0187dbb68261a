"""The tuning table's entries and their lookup (plain Python: no Triton needed, so the table can
be checked and looked up on any variant).

A table entry names one launch of one of the two kernels, as a list (the form ``_tuning.py``
stores, written by ``benchmarks/tune.py``):

* ``["splitk", BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages]``: the split-K
  kernel; BLOCK_M 1 is the FMA GEMV (``USE_DOT=False``), else a power of two >= 16 (tl.dot);
  SPLIT_K an upper bound (the launcher rounds the slice to whole K steps, no empty slices);
* ``["tiled", BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages]``: the tiled kernel;
  BLOCK_K >= 128 (its nibble planes are BLOCK_K / 8 deep, and an MMA takes 16 and up);
* ``["mma", SPLIT_K, num_warps, ROW_TILES]`` or ``["mma", SPLIT_K, num_warps, ROW_TILES, RING]``:
  the compiled CUDA small-M kernel (csrc/w4a16_mma.cu, M <= 32): K split over SPLIT_K blocks per
  row block (an upper bound, as for splitk), 4 or 8 warps per block, 1 or 2 16-row tiles per
  warp; RING 1 (the default where it is left out) streams the weights through the TMA ring where
  the op can run it (sm90), 0 through each lane's registers (the kernel that was faster at some
  shapes, e.g. Llama-3-8B O at M = 16);
* ``["wgmma", BLOCK_N, BLOCK_M, SPLIT_K]``: the compiled Hopper large-M kernel
  (csrc/w4a16_wgmma.cu, capability 9.0): a block tile of BLOCK_N rows of W x BLOCK_M tokens,
  one of ``WGMMA_TILES`` (BLOCK_N 64: one warpgroup a block, twice the tiles of 128), K split
  over SPLIT_K blocks per tile (an upper bound: at most ``WGMMA_MAX_SPLIT`` and K / 64; at the
  256-token tiles the blocks are a thread-block cluster);
  SPLIT_K 0 is stream-K: one persistent block per block slot of the SMs, each an equal run of
  all tiles' K steps (for tiles that leave SMs idle, e.g. 48 of them on 132 SMs).

:func:`config_of` turns an entry into the dict ``_kernels.launch_w4a16`` takes (``cfg``), and
:func:`entry_of` back; :func:`tuned_config` looks an M up in the table.
"""

from __future__ import annotations

# M buckets the table is tuned for: a call with M rows takes the first bucket with M <= m_max;
# M beyond the last bucket (and any key the table lacks) takes the structural default.
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
DTYPES = ("bfloat16", "float16")
_FIELDS = {
    "splitk": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages"),
    "tiled": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"),
    "mma": ("SPLIT_K", "num_warps", "ROW_TILES", "RING"),
    "wgmma": ("BLOCK_N", "BLOCK_M", "SPLIT_K"),
}
# What the compiled kernel is instantiated for (w4a16_mma.cu launch_shape).
MMA_WARPS = (4, 8)
MMA_ROW_TILES = (1, 2)
MMA_MAX_M = 32
# The Hopper kernel's block tiles (W rows, tokens), in the op's tile-id order (w4a16_wgmma.h).
WGMMA_TILES = ((128, 256), (128, 128), (128, 64), (64, 256))
# Its largest K split (csrc/w4a16_wgmma.h kWgmmaMaxSplit): a portable thread-block cluster at the
# 256-token tile; the same bound at the others.
WGMMA_MAX_SPLIT = 8


def _pow2(v) -> bool:
    return type(v) is int and v >= 1 and not v & (v - 1)


def check_entry(entry) -> None:
    """Raises ValueError / TypeError naming what is wrong with a table entry (module docstring)."""
    if not isinstance(entry, (list, tuple)) or not entry or entry[0] not in _FIELDS:
        raise ValueError(f"tuning entry: expected ['splitk' | 'tiled', 6 ints], ['mma', 3 or 4 ints] or ['wgmma', 3 ints], "
                         f"got {entry!r}")  # fmt: skip
    kernel, values = entry[0], list(entry[1:])
    fields = _FIELDS[kernel]
    if len(values) != len(fields) and not (kernel == "mma" and len(values) == len(fields) - 1):
        raise ValueError(f"tuning entry {entry!r}: expected {len(fields)} values {fields}"
                         + (" (or the first 3)" if kernel == "mma" else ""))
    cfg = dict(zip(fields, values))
    for name, v in cfg.items():
        low = 0 if name == "RING" or (kernel == "wgmma" and name == "SPLIT_K") else 1  # wgmma SPLIT_K 0: stream-K
        if type(v) is not int or v < low:
            raise TypeError(f"tuning entry {entry!r}: {name} must be an int >= {low}, got {v!r}")
    if kernel == "mma":
        if cfg.get("RING", 1) not in (0, 1):
            raise ValueError(f"tuning entry {entry!r}: RING must be 0 or 1, got {cfg['RING']}")
        if cfg["num_warps"] not in MMA_WARPS or cfg["ROW_TILES"] not in MMA_ROW_TILES:
            raise ValueError(f"tuning entry {entry!r}: num_warps must be one of {MMA_WARPS}, ROW_TILES one of {MMA_ROW_TILES}")
        return
    if kernel == "wgmma":
        if (cfg["BLOCK_N"], cfg["BLOCK_M"]) not in WGMMA_TILES:
            raise ValueError(f"tuning entry {entry!r}: (BLOCK_N, BLOCK_M) must be one of {WGMMA_TILES}")
        if cfg["SPLIT_K"] > WGMMA_MAX_SPLIT:
            raise ValueError(f"tuning entry {entry!r}: SPLIT_K must be at most {WGMMA_MAX_SPLIT} (a cluster)")
        return
    for name in ("BLOCK_N", "BLOCK_K", "num_warps"):
        if not _pow2(cfg[name]) or cfg[name] < {"BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 1}[name]:
            raise ValueError(f"tuning entry {entry!r}: {name} must be a power of two >= 16 (warps >= 1), got {cfg[name]}")
    if kernel == "tiled" and cfg["BLOCK_K"] < 128:
        raise ValueError(f"tuning entry {entry!r}: the tiled kernel's BLOCK_K must be >= 128, got {cfg['BLOCK_K']}")
    bm = cfg["BLOCK_M"]
    if not _pow2(bm) or (bm != 1 and bm < 16) or (kernel == "tiled" and bm < 16):
        raise ValueError(f"tuning entry {entry!r}: BLOCK_M must be a power of two >= 16 (or 1: the split-K GEMV), got {bm}")


def config_of(entry) -> dict:
    """The ``cfg`` dict of ``_kernels.launch_w4a16`` for a (checked) table entry."""
    check_entry(entry)
    kernel = entry[0]
    cfg = {"kernel": kernel, **dict(zip(_FIELDS[kernel], entry[1:]))}
    if kernel == "splitk":
        cfg["USE_DOT"] = cfg["BLOCK_M"] > 1
    if "RING" in cfg:
        cfg["RING"] = bool(cfg["RING"])
    return cfg


def entry_of(cfg: dict) -> list:
    """The table entry of a ``cfg`` dict (``w4a16_config``'s form); the inverse of :func:`config_of`."""
    kernel = cfg["kernel"]
    if kernel not in _FIELDS:
        raise ValueError(f"cfg: kernel must be 'splitk', 'tiled', 'mma' or 'wgmma', got {kernel!r}")
    return [kernel, *(int(cfg[f]) for f in _FIELDS[kernel] if f != "RING" or f in cfg)]


def table_key(gpu: str, dtype: str, N: int, K: int, group_size: int) -> tuple[str, str, int, int, int]:
    """``(gpu_name, dtype, N, K, group_size)``: what the table is keyed by. gpu_name is
    ``torch.cuda.get_device_name()`` (``"cpu"`` for CPU tensors, which only tests use)."""
    return (gpu, dtype, int(N), int(K), int(group_size))


def tuned_bucket(table: dict, gpu: str, dtype: str, N: int, K: int, group_size: int, M: int) -> tuple[int, dict] | None:
    """(m_max, cfg) of the table's launch for M rows of this key: the first bucket with M <=
    m_max, its entry as a ``cfg`` dict; None where the table has no key, M lies past the last
    bucket, or the bucket holds None (the structural default measured as fast as any candidate)."""
    rows = table.get(table_key(gpu, dtype, N, K, group_size)) if table else None
    for m_max, entry in rows or ():
        if M <= m_max:
            return None if entry is None else (m_max, config_of(entry))
    return None


def tuned_config(table: dict, gpu: str, dtype: str, N: int, K: int, group_size: int, M: int) -> dict | None:
    """:func:`tuned_bucket`'s launch alone."""
    bucket = tuned_bucket(table, gpu, dtype, N, K, group_size, M)
    return None if bucket is None else bucket[1]


def check_table(table: dict) -> None:
    """Every key and bucket row well formed (what tests/test_w4a16.py asserts of _tuning.TABLE)."""
    for key, rows in table.items():
        if not (isinstance(key, tuple) and len(key) == 5 and isinstance(key[0], str) and key[1] in DTYPES
                and all(type(v) is int for v in key[2:]) and key[2] > 0 and key[3] > 0):  # fmt: skip
            raise ValueError(f"tuning key: expected (gpu, dtype of {DTYPES}, N, K, group_size), got {key!r}")
        buckets = [m for m, _ in rows]
        if buckets != sorted(set(buckets)) or not set(buckets) <= set(BUCKETS):
            raise ValueError(f"tuning rows of {key!r}: buckets must be increasing, of {BUCKETS}, got {buckets}")
        for _, entry in rows:
            if entry is not None:
                check_entry(entry)
