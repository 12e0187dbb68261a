# generated from common/python/triton_launch.py by `fused-llm sync`, do not edit
"""Per-shape launch plans for Triton kernels: the host cost of a launch whose shapes repeat.

Why: at decode shapes the GPU work of one op is 2-80 us, and the host cost of Triton's JIT
launch path is in the same range. On the lent H100 host (2026-11-23, Triton 3.6) one launch of
rope-triton's 40-argument kernel cost 39.7 us through ``kernel[grid](...)`` (argument binding,
specialization of every argument, cache-key hashing) and 9.9 us through the compiled kernel's
own launcher with the argument list of an earlier call; one ``torch.add`` cost 7.3 us.

A plan is made by one ordinary JIT launch and remembers the compiled kernel, the grid and
the full argument list. Later calls with the same key swap in the arguments that change
(tensors, tensor descriptors) and call the launcher directly. The key is the caller's
business and must determine everything else: every integer argument (Triton specializes
integers on == 1 and % 16 == 0) and, for every tensor argument, dtype and whether its address
is 16-byte aligned (Triton specializes pointers on that).

Only on GPUs, with Triton's launch hooks unset (a profiler hooking launches sees every launch
through the JIT path instead), and never under Triton's interpreter.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Hashable, Sequence

import torch

# Entries per table (launch plans, call signatures): see SignatureTable.
MAX_PLANS = 512


def _hooks_unset() -> bool:
    try:
        from triton import knobs

        hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    except (ImportError, AttributeError):
        return False
    # Triton 3.6 keeps each hook as a HookChain (an empty list of calls when none is set);
    # earlier versions keep None.
    return all(h is None or (hasattr(h, "calls") and not h.calls) for h in hooks)


@functools.cache
def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def triton_enabled_for(t: torch.Tensor) -> bool:
    """True when an op on ``t`` runs the package's Triton kernels: GPU tensors (CUDA or ROCm),
    and CPU tensors when ``TRITON_INTERPRET=1`` (Triton's interpreter); else the plain-torch
    path. Imports no Triton itself, so a package without Triton installed still answers."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t: expected a torch.Tensor, got {type(t).__name__}")
    if t.is_cuda:
        return True
    return t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1" and _triton_importable()


_GPU_NAMES: dict[int, str] = {}


@torch.compiler.assume_constant_result
def _query_gpu_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def device_name(device: torch.device) -> str:
    """The tuning tables' GPU key: ``torch.cuda.get_device_name``, cached per device; the
    device type (``"cpu"``) for other tensors, which only tests use. Under torch.compile a
    constant of the graph (queried once at trace time), so a compiled call dispatches from a
    tuning table exactly as an eager one."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    name = _GPU_NAMES.get(index)
    if name is None:
        name = _query_gpu_name(index)
        if not torch.compiler.is_compiling():
            _GPU_NAMES[index] = name
    return name


def plans_enabled() -> bool:
    """Plans replace JIT launches: not under Triton's interpreter, not when disabled with
    ``FUSED_LLM_LAUNCH_PLANS=0`` (to compare), not when launch hooks are installed."""
    return (
        os.environ.get("TRITON_INTERPRET") != "1"
        and os.environ.get("FUSED_LLM_LAUNCH_PLANS", "1") != "0"
        and _hooks_unset()
    )


def _direct_entry(kernel: Any):
    """The C entry point behind a compiled kernel's launcher and what the launcher's Python
    wrapper adds on the way to it, for the wrapper this was written against (Triton 3.5 / 3.6
    ``CudaLauncher``, optionally wrapped by ``wrap_handle_tensordesc``); None for any other
    (ROCm's launcher, other Triton versions), which then launch through ``kernel.run``.

    Returns ``(entry, (cooperative, pdl), {argument index: descriptor metadata}, expand)``:
    ``entry(gx, gy, gz, stream, function, cooperative, pdl, global_scratch, profile_scratch,
    packed_metadata, launch_metadata, enter_hook, exit_hook, *args)`` with every host tensor
    descriptor argument replaced by ``expand(descriptor, metadata)`` (its encoded CUtensorMap,
    shape and strides)."""
    run = getattr(kernel, "run", None)
    entry = getattr(run, "launch", None)
    if entry is None or type(run).__name__ != "CudaLauncher":
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None  # the wrapper allocates scratch memory for each launch
    prefix = (getattr(run, "launch_cooperative_grid", None), getattr(run, "launch_pdl", None))
    if None in prefix:
        return None
    if type(entry).__name__ == "builtin_function_or_method":
        return entry, prefix, {}, None
    code, cells = getattr(entry, "__code__", None), getattr(entry, "__closure__", None) or ()
    if code is None or len(code.co_freevars) != len(cells):
        return None
    scope = {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}
    launcher, indices, metas = scope.get("launcher"), scope.get("tensordesc_indices"), scope.get("tensordesc_meta")
    expand = entry.__globals__.get("make_tensordesc_arg")
    if type(launcher).__name__ != "builtin_function_or_method" or not isinstance(indices, set) or expand is None:
        return None
    metas = list(metas) if metas else [None] * len(indices)
    if len(metas) != len(indices):
        return None
    # The wrapper hands the n-th descriptor argument (in argument order) the n-th metadata.
    return launcher, prefix, dict(zip(sorted(indices), metas)), expand


class LaunchPlan:
    """A compiled kernel, its grid and argument list; ``plan(*varying)`` launches it with the
    varying arguments (in the order the plan was made with) swapped in, on the current stream.

    Where `_direct_entry` recognizes the launcher, a plan calls its C entry point itself: on the
    H100 host (Triton 3.6) that took rope-triton's launch from 8.0 to ~5 us, and gated-mlp's
    three-descriptor launch from 17 to ~7 us, because the wrapper re-encodes every tensor
    descriptor on every call while a plan encodes the unchanged ones (the weights') once."""

    __slots__ = ("_launcher", "_function", "_metadata", "_grid", "_args", "_slots", "_device",
                 "_entry", "_head", "_places", "_expand", "_encoded")

    def __init__(self, kernel: Any, grid: Sequence[int], args: list, slots: Sequence[int], device: int):
        self._launcher = kernel.run
        self._function = kernel.function
        self._metadata = kernel.packed_metadata
        grid = tuple(grid) + (1,) * (3 - len(grid))
        self._grid = grid
        self._slots = tuple(slots)
        # The varying slots are filled per call: the template holds no tensor of the first
        # call (it would keep that call's activations alive for the life of the plan).
        self._args = [None if i in self._slots else a for i, a in enumerate(args)]
        self._device = device
        self._entry = None
        direct = _direct_entry(kernel)
        if direct is not None:
            self._make_direct(args, *direct)

    def _make_direct(self, args: list, entry, prefix, descs: dict, expand) -> None:
        # The entry's argument list with every descriptor expanded: fixed arguments once, here;
        # each varying one gets its place (and its expanded width for a descriptor).
        template: list = []
        places = []
        for i, a in enumerate(args):
            expanded = expand(a, descs[i]) if i in descs else None
            if i in self._slots:
                width = len(expanded) if expanded is not None else 0
                places.append((len(template), width, descs.get(i)))
                template.extend([None] * max(width, 1))
            elif expanded is not None:
                template.extend(expanded)
            else:
                template.append(a)
        by_slot = dict(zip(self._slots, places))
        self._places = tuple(by_slot[s] for s in self._slots)
        self._args = template
        self._expand = expand
        self._encoded = [None] * len(self._places)  # (descriptor, expansion) of tensor-free descriptors
        self._head = (self._function, *prefix, None, None, self._metadata, None, None, None)
        self._entry = entry

    def __call__(self, *varying: Any) -> None:
        g0, g1, g2 = self._grid
        stream = torch._C._cuda_getCurrentRawStream(self._device)
        args = list(self._args)
        if self._entry is None:
            for slot, value in zip(self._slots, varying):
                args[slot] = value
            self._launcher(g0, g1, g2, stream, self._function, self._metadata, None, None, None, *args)
            return
        for n, ((pos, width, meta), value) in enumerate(zip(self._places, varying)):
            if not width:
                args[pos] = value
                continue
            encoded = self._encoded[n]
            if encoded is None or encoded[0] is not value:
                encoded = (value, self._expand(value, meta))
                # A descriptor of a weight (an Address base) comes back unchanged on every call
                # of this plan: encode it once. One of a tensor is an activation: not kept.
                if not isinstance(value.base, torch.Tensor):
                    self._encoded[n] = encoded
            args[pos:pos + width] = encoded[1]
        self._entry(g0, g1, g2, stream, *self._head, *args)


class SignatureTable:
    """Values by call signature, at most MAX_PLANS of them: decode repeats a handful of
    signatures, prefill lengths vary, so the table is cleared when full rather than growing
    without bound (a miss costs one call down the slow path)."""

    __slots__ = ("entries",)

    def __init__(self):
        self.entries: dict[Hashable, Any] = {}

    def get(self, key: Hashable) -> Any:
        return self.entries.get(key)

    def put(self, key: Hashable, value: Any) -> None:
        if len(self.entries) >= MAX_PLANS:
            self.entries.clear()
        self.entries[key] = value


class PlanTable(SignatureTable):
    """Plans of one Triton kernel by key. ``launch(key, grid, varying_names, args, kwargs)``
    launches through the plan for ``key`` when there is one, else through the JIT (and keeps
    a plan of that launch). ``varying_names`` are the kernel parameters whose values change
    between calls with the same key (tensors, descriptors), in the order of ``args`` of later
    calls: the plan is called as ``plan(*[bound[name] for name in varying_names])``."""

    __slots__ = ("_defaults", "_index", "jit_fn")

    def __init__(self, jit_fn: Any):
        super().__init__()
        self.jit_fn = jit_fn
        # Triton's interpreter hands out InterpretedFunction objects without these: no plans.
        names = list(getattr(jit_fn, "arg_names", ()))
        self._index = {name: i for i, name in enumerate(names)}
        self._defaults = {p.name: p.default for p in getattr(jit_fn, "params", ()) if _has_default(p)}

    def launch_and_plan(self, key: Hashable | None, grid: Sequence[int], varying: Sequence[str], args: Sequence, kwargs: dict,
                        store: bool = True) -> LaunchPlan | None:
        """One JIT launch; when ``key`` is not None and plans are enabled, return its plan, kept
        under ``key`` unless ``store`` is False (a plan the caller combines with another's)."""
        kernel = self.jit_fn[tuple(grid)](*args, **kwargs)
        if key is None or kernel is None or not plans_enabled() or not hasattr(kernel, "packed_metadata"):
            return None
        names = self.jit_fn.arg_names
        full = list(args)
        for name in names[len(args):]:
            if name in kwargs:
                full.append(kwargs[name])
            elif name in self._defaults:
                full.append(self._defaults[name])
            else:  # an argument the JIT filled in some other way: no plan
                return None
        device = torch.cuda.current_device()
        plan = LaunchPlan(kernel, grid, full, [self._index[n] for n in varying], device)
        if store:
            self.put(key, plan)
        return plan


def _has_default(param: Any) -> bool:
    import inspect

    return getattr(param, "default", inspect.Parameter.empty) is not inspect.Parameter.empty


class Address:
    """An address with a dtype, standing in for a tensor as a descriptor's base: a cached
    descriptor of a weight then keeps no reference to the weight (the plan's key holds the
    address, so a later tensor at that address with the same key is described correctly)."""

    __slots__ = ("_ptr", "dtype")

    def __init__(self, tensor: torch.Tensor):
        self._ptr = tensor.data_ptr()
        self.dtype = tensor.dtype

    def data_ptr(self) -> int:
        return self._ptr


class HostDescriptor:
    """What the launcher reads of a host tensor descriptor (base, shape, strides, padding),
    without ``triton.tools.tensor_descriptor.TensorDescriptor``'s per-construction checks
    (2.8 us on the H100 host): only for plans, whose first (JIT) launch validated the same
    shapes, strides and alignment with a real descriptor."""

    __slots__ = ("base", "shape", "strides", "block_shape", "padding")

    def __init__(self, base, shape, strides, block_shape, padding: str = "zero"):
        self.base, self.shape, self.strides, self.block_shape, self.padding = base, shape, strides, block_shape, padding


# Buffers zeroed_buffer replaced by larger ones stay alive: a captured CUDA graph may still
# point at them.
_RETIRED: list[torch.Tensor] = []


def zeroed_buffer(cache: dict, device: torch.device, n: int, dtype: torch.dtype) -> torch.Tensor:
    """``cache[device]``, a zeroed buffer of at least n (and 4096) elements that the kernels
    leave zeroed (the last program of a tile resets what it used: split-K arrival counters,
    atomic workspaces), so a call costs no memset; made or grown here. Made inside a
    torch.compile'd CUDA graph (cudagraph trees), it would come from the graph's pool and
    outlive it, which cudagraph trees refuses: make it before (skinny-gemm's
    reserve_workspaces). Calls on concurrent streams of one device share it: one stream at a
    time per device."""
    buf = cache.get(device)
    if buf is None or buf.numel() < n:
        if buf is not None:
            _RETIRED.append(buf)
        buf = torch.zeros(max(n, 4096), dtype=dtype, device=device)
        cache[device] = buf
    return buf


def workspace_device(device: torch.device | str) -> torch.device | None:
    """The device a package's ``reserve_workspaces`` makes buffers for: ``device`` as an indexed
    CUDA device (``"cuda"`` is the current one), or None where its Triton kernels do not run
    there (CPU, no Triton)."""
    dev = torch.device(device)
    if dev.type != "cuda" or not triton_enabled_for(torch.empty(0, device=dev)):
        return None
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def aligned16(*tensors: torch.Tensor) -> tuple[bool, ...]:
    """Whether each tensor's address is a multiple of 16 bytes (Triton's pointer specialization)."""
    return tuple(t.data_ptr() % 16 == 0 for t in tensors)


# ---------------------------------------------------------------------------------------------
# Launch configurations
# ---------------------------------------------------------------------------------------------
# The convention of both Triton packages: each kernel's launch configuration is a frozen
# dataclass (its Triton meta-parameters, num_warps and num_stages, under the kernel's own
# names) with ``launch_kwargs()``, the keywords of the launch; one function per kernel picks
# it by shape and GPU, once per launch plan. A launcher's ``cfg``, when given, replaces the
# picked configuration whole (nothing is merged in); to change a field of the picked one, pass
# ``dataclasses.replace(picked, FIELD=value)``.


def check_config(
    config: Any,
    *,
    powers_of_two: dict[str, int] | None = None,
    at_least: dict[str, int] | None = None,
    flags: Sequence[str] = (),
    optional: Sequence[str] = (),
    choices: dict[str, Sequence[int]] | None = None,
) -> None:
    """The field checks of a configuration dataclass's ``__post_init__``: ``powers_of_two`` and
    ``at_least`` map int fields to their minimum, ``flags`` are bools, ``choices`` maps int fields
    to the values a compiled kernel has code for, and the fields in ``optional`` may also be None
    (the launcher decides). Errors name ``Class.FIELD``, what was expected and what came."""
    cls = type(config).__name__
    for name, allowed in (choices or {}).items():
        value = getattr(config, name)
        if type(value) is not int:
            raise TypeError(f"{cls}.{name}: expected an int, got {value!r}")
        if value not in allowed:
            raise ValueError(f"{cls}.{name}: expected one of {list(allowed)}, got {value}")
    for name, low in {**(powers_of_two or {}), **(at_least or {})}.items():
        value = getattr(config, name)
        if value is None and name in optional:
            continue
        if type(value) is not int:
            raise TypeError(f"{cls}.{name}: expected an int, got {value!r}")
        if name in (powers_of_two or {}) and (value < low or value & (value - 1)):
            raise ValueError(f"{cls}.{name}: expected a power of two >= {low}, got {value}")
        if value < low:
            raise ValueError(f"{cls}.{name}: expected an int >= {low}, got {value}")
    for name in flags:
        value = getattr(config, name)
        if type(value) is not bool and not (value is None and name in optional):
            expected = "True, False or None" if name in optional else "True or False"
            raise TypeError(f"{cls}.{name}: expected {expected}, got {value!r}")


def check_override(cfg: Any, *classes: type) -> None:
    """A launcher's ``cfg`` when given: an instance of one of ``classes`` (the kernel's
    configuration dataclasses), which replaces the picked configuration whole."""
    if not isinstance(cfg, classes):
        expected = " or ".join(c.__name__ for c in classes)
        raise TypeError(
            f"cfg: expected a {expected} (it replaces the picked configuration whole; to change fields of "
            f"the picked one, pass dataclasses.replace(picked, ...)), got {type(cfg).__name__}"
        )


__all__ = [
    "MAX_PLANS", "Address", "HostDescriptor", "LaunchPlan", "PlanTable", "SignatureTable", "aligned16",
    "check_config", "check_override", "plans_enabled", "workspace_device", "zeroed_buffer",
]  # fmt: skip
