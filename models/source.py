"""Where a run's model comes from: a preset (random weights) or a checkpoint directory, in one place.

`resolve_model(ref, seed)` takes what `--model` holds and returns a `ModelSource`: the config (read
from `config.json` / `model_config.json` alone, no tensors, so a rank that only schedules never
loads weights), `load_params(mesh)` (each host reads its local files onto its own devices), and
`weights`, the identity of the weights that enters the KV store's fingerprint:

* a preset of any family (`tiny`, `deepseek-tiny`, ...): `random-v2:<seed>` (v2: the draws of
  `models.params.random_leaf`; a store written under the earlier `random:<seed>` draws is refused);
* a Hugging Face directory (`config.json` + `*.safetensors`, one file or sharded; Llama, Qwen2,
  DeepSeek-V3 / V3.2 through `models.load_hf`): `sha256:<16 hex>` over the resolved config and every
  safetensors file's sha256: the file's own where Hugging Face recorded it (a link into a hub cache,
  whose blobs are named by it, or a `hf download --local-dir` copy's `.cache/huggingface/download/
  <file>.metadata`, while the file is not newer), else its bytes' (hashed once, files in parallel);
* an Orbax checkpoint of the project's layout (`model_config.json` + `params/`, as
  `models.save_checkpoint` writes it): the same digest over the config and the files under `params/`
  (less Orbax's timestamp files). Orbax does not write the same bytes twice, so a re-saved copy of
  the same weights is another identity: its KV is kept apart, never served wrongly.

Digests are cached in-process per file (path, size, mtime), so resolving again costs a `stat`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import glob
import hashlib
import json
import os
import re
import threading

from models.config import UnknownPreset
from models.presets import PRESETS, preset_names

CHUNK = 8 << 20  # bytes hashed per read
_VOLATILE = {"_CHECKPOINT_METADATA", "commit_success.txt"}  # Orbax's timestamps: not the weights
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FILE_HASHES: dict[tuple[str, int, int], str] = {}
_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A resolved `--model`: `kind` is "preset", "hf" or "orbax"; `path` the absolute directory
    (None for a preset); `seed` the random-weight seed of a preset."""

    ref: str
    kind: str
    config: object  # the config of the model's family
    path: str | None = None
    seed: int = 0

    @functools.cached_property
    def weights(self) -> str:
        """The weights' identity for the store fingerprint: `random-v2:<seed>` or `sha256:<16 hex>`."""
        if self.kind == "preset":
            return f"random-v2:{self.seed}"
        files = (sorted(glob.glob(os.path.join(self.path, "*.safetensors"))) if self.kind == "hf"
                 else _orbax_files(os.path.join(self.path, "params")))
        return "sha256:" + _digest(self.path, files, self.config)[:16]

    @property
    def describe(self) -> str:
        """The identity for people: the preset and `random-v2:<seed>`, or the checkpoint's path and digest."""
        return f"{self.path or self.ref} ({self.weights})"

    def load_params(self, mesh=None):
        """The params on this process's devices: sharded over `mesh` by the logical-axis table when given,
        else on the default device. Reads only local files; raises CheckpointError naming a tensor that
        is missing, extra or misshaped."""
        import jax

        from models import checkpoint, hf, params
        if self.kind == "preset":
            values = params.init_params(self.config, self.seed)
            return values if mesh is None else params.shard_params(values, self.config, mesh)
        if self.kind == "orbax":
            shardings = None if mesh is None else params.param_shardings(self.config, mesh)
            return checkpoint.restore_checkpoint(self.path, shardings)[1]
        # Hugging Face: assemble in host memory when sharding, so no one device holds the whole model.
        with jax.default_device(jax.devices("cpu")[0] if mesh is not None else None):
            cfg, values = hf.load_hf(self.path)
        if cfg != self.config:
            raise checkpoint.CheckpointError(f"{self.path}: its tensors were read as {cfg}, its config as "
                                             f"{self.config}")
        return values if mesh is None else params.shard_params(values, cfg, mesh)


def resolve_model(ref: str, seed: int = 0) -> ModelSource:
    """What `--model` names: a preset of any family or a checkpoint directory (see the module doc).

    Reads only the config. Raises UnknownPreset (a ModelConfigError) for a name that is neither a
    preset nor a directory, listing the presets; CheckpointError for a directory that is not a
    checkpoint or whose config is not supported, naming the field."""
    if ref in PRESETS:
        return ModelSource(ref, "preset", PRESETS[ref], seed=seed)
    path = os.path.abspath(ref)
    if not os.path.isdir(path):
        raise UnknownPreset(f"unknown model preset {ref!r}, and no checkpoint directory of that name; presets: "
                            f"{', '.join(preset_names())}; or a Hugging Face directory (config.json + "
                            f"*.safetensors) or an Orbax checkpoint (model_config.json), as docs/models.md says")
    from models import checkpoint
    if os.path.exists(os.path.join(path, "model_config.json")):
        return ModelSource(path, "orbax", checkpoint.read_config(path), path)
    if not os.path.exists(os.path.join(path, "config.json")):
        raise checkpoint.CheckpointError(
            f"--model {path}: a directory without config.json (Hugging Face) or model_config.json (Orbax); "
            f"presets: {', '.join(preset_names())}")
    from models import hf
    try:  # the config `models.load_hf` will build for this directory, from config.json alone
        return ModelSource(path, "hf", hf.hf_config(hf.read_hf_config(path), os.path.basename(path)), path)
    except KeyError as e:
        raise checkpoint.CheckpointError(f"{path}/config.json lacks the field {e.args[0]!r}") from None


def _orbax_files(root: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names if f not in _VOLATILE)


def _digest(root: str, files: list[str], config) -> str:
    """sha256 over the config (its name aside: a copy elsewhere is the same weights) and, per file in
    order, its path under `root` and its contents' sha256."""
    h = hashlib.sha256(json.dumps({**dataclasses.asdict(config), "name": None}, sort_keys=True, default=str).encode())
    with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:  # hashlib frees the GIL
        hashes = list(pool.map(file_sha256, files))
    for f, digest in zip(files, hashes, strict=True):
        h.update(os.path.relpath(f, root).encode() + b"\0" + digest.encode())
    return h.hexdigest()


def _recorded_sha256(path: str) -> str | None:
    """The sha256 Hugging Face recorded for this file: the name of the hub-cache blob it links to, or
    the etag of a `--local-dir` download's metadata (commit, etag, time) while the file is not newer."""
    real = os.path.realpath(path)
    if real != os.path.abspath(path) and _SHA256.fullmatch(os.path.basename(real)):
        return os.path.basename(real)
    head, name = os.path.split(os.path.abspath(path))
    try:
        with open(os.path.join(head, ".cache", "huggingface", "download", name + ".metadata")) as f:
            _, etag, stamp = (f.readline().strip() for _ in range(3))
        fresh = os.stat(path).st_mtime - 1 <= float(stamp)  # huggingface_hub's own test of the record
    except (OSError, ValueError):
        return None
    return etag if fresh and _SHA256.fullmatch(etag) else None


def file_sha256(path: str) -> str:
    """The sha256 of a file's bytes: as Hugging Face recorded it when it did, else read in chunks;
    cached per (real path, size, mtime)."""
    if recorded := _recorded_sha256(path):
        return recorded
    real = os.path.realpath(path)
    st = os.stat(real)
    key = (real, st.st_size, st.st_mtime_ns)
    with _LOCK:
        if key in _FILE_HASHES:
            return _FILE_HASHES[key]
    h = hashlib.sha256()
    with open(real, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    with _LOCK:
        _FILE_HASHES[key] = h.hexdigest()
    return _FILE_HASHES[key]


__all__ = ["ModelSource", "resolve_model", "file_sha256"]
