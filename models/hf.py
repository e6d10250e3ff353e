"""Hugging Face import for every family: a local directory of `config.json` plus one or several
`*.safetensors` files (never the network). The family whose `hf_names` hold the config's `model_type`
or first architecture maps it (`Family.hf_config`, `Family.load_hf`); the pieces here read the files
and name what is wrong: a missing config, a missing, misshaped or unexpected tensor. `save_hf` writes
the other way (`Family.export_hf`).
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from models.checkpoint import CheckpointError
from models.presets import families as registered_families


class HFImportError(CheckpointError):
    """A Hugging Face checkpoint this loader cannot read; the message names the field or tensor."""


def read_hf_config(path: str) -> dict:
    """The `config.json` of directory `path` as a dict; raises HFImportError when absent or not JSON."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        raise HFImportError(f"{path}: no config.json; expected a Hugging Face checkpoint directory") from None
    except json.JSONDecodeError as e:
        raise HFImportError(f"{path}/config.json is not JSON: {e}") from None


def family_for(hf: dict):
    """The family whose `hf_names` hold this config.json's `model_type` or first architecture."""
    arch = (hf.get("architectures") or ["?"])[0]
    families = registered_families()
    for family in families:
        if hf.get("model_type") in family.hf_names or arch in family.hf_names:
            return family
    supported = "; ".join(f"{f.name}: {', '.join(f.hf_names)}" for f in families)
    raise HFImportError(f"config.json: unsupported architecture {arch!r} (model_type {hf.get('model_type')!r}); "
                        f"supported: {supported}")


def hf_config(hf: dict, name: str = "hf"):
    """The config a config.json dict describes, without reading any tensor."""
    return family_for(hf).hf_config(hf, name)


def load_hf(path: str, dtype: str | None = None):
    """Import a local Hugging Face checkpoint directory of any family -> (config, params); params in
    `dtype` when given, else the file's. Raises HFImportError (a CheckpointError) naming the field or
    tensor that is unsupported, missing, unexpected or misshaped."""
    hf = read_hf_config(path)
    return family_for(hf).load_hf(path, hf, dtype)


def save_hf(path: str, params, cfg) -> None:
    """Write params as a Hugging Face directory `path` (created; must not exist): `config.json` and one
    `model.safetensors` (float32) in the family's published layout, which `load_hf` reads back."""
    config, tensors = cfg.family.export_hf(params, cfg)
    os.makedirs(path)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


def open_tensors(path: str) -> dict:
    """Every tensor name of the directory's safetensors files -> the open file that holds it."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise HFImportError(f"{path}: no *.safetensors files")
    return {k: h for h in (safe_open(f, framework="numpy") for f in files) for k in h.keys()}


def read_tensor(tensors: dict, name: str, shape: tuple[int, ...], path: str) -> np.ndarray:
    """Tensor `name` (from `open_tensors`), checked to have `shape`."""
    if name not in tensors:
        raise HFImportError(f"{path}: missing tensor {name} (expected shape {shape})")
    got = tuple(tensors[name].get_slice(name).get_shape())
    if got != shape:
        raise HFImportError(f"{path}: tensor {name} has shape {got}, expected {shape}")
    return tensors[name].get_tensor(name)


def refuse_extra(tensors: dict, used: set[str], ignored, path: str, what: str = "") -> None:
    """Raise HFImportError naming the tensors neither used nor `ignored(name)`."""
    extra = sorted(k for k in tensors if k not in used and not ignored(k))
    if extra:
        raise HFImportError(f"{path}: unexpected tensors {extra[:8]}{' ...' if len(extra) > 8 else ''}{what}")
