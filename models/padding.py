"""Padding to shape buckets without compiling: on the host for host arrays, by `jnp.pad` for device
arrays. A long multi-turn run pads every new length to a few buckets (`models.buckets`), so it compiles
a handful of programs, not one per length."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

HOST_ALIGN = 64  # bytes: XLA's CPU client aliases a host array aligned to this instead of copying it


def host_padded(a, axis: int, size: int, dtype=None) -> np.ndarray:
    """`a` copied (as `dtype`, default its own) into a new host array zero-padded (or cut) along
    `axis` to `size`, aligned to `HOST_ALIGN` bytes so that `jax.device_put` takes it as it is on
    the CPU (XLA's CPU client aliases an aligned host array; an unaligned one it copies again) and
    transfers it elsewhere. Padding on the host compiles nothing, where an eager `jnp.pad` or
    slice compiles a program for every new unpadded length (0.2-0.5 s a pass on CPU for `small`:
    every agent turn has a new length)."""
    a = np.asarray(a)
    dtype = a.dtype if dtype is None else np.dtype(dtype)
    shape = (*a.shape[:axis], size, *a.shape[axis + 1:])
    owner = np.empty(int(np.prod(shape)) * dtype.itemsize + HOST_ALIGN, np.uint8)
    start = -owner.ctypes.data % HOST_ALIGN
    out = owner[start:start + owner.size - HOST_ALIGN].view(dtype).reshape(shape)
    n = min(a.shape[axis], size)
    out[(slice(None),) * axis + (slice(0, n),)] = a[(slice(None),) * axis + (slice(0, n),)]
    out[(slice(None),) * axis + (slice(n, None),)] = 0
    return out


def pad_to(a, axis: int, size: int):
    """Device array `a` zero-padded along `axis` to `size` (itself when it has that size)."""
    if a.shape[axis] == size:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, size - a.shape[axis])
    return jnp.pad(a, widths)


def padded_kv(kv, length: int, padded: int, dtype) -> jax.Array:
    """kv [L, S, ...]'s first `length` positions as a new array of `dtype` zero-padded to `padded`
    positions: a copy, since JAX may alias a NumPy buffer that the caller reuses (a DE buffer). Host
    KV is padded on the host, which compiles nothing; an eager pad would compile a program for
    every new length (~0.2 s each on CPU for `small`: every agent turn has one). That copy is the
    only one: `jax.device_put` aliases it on the CPU."""
    if isinstance(kv, np.ndarray):
        return jax.device_put(host_padded(kv[:, :length], 1, padded, dtype))
    return pad_to(jnp.array(kv[:, :length], dtype), 1, padded)
