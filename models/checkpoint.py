"""Orbax checkpoints of any family: the params with the config's fields beside them (`model_config.json`).
Hugging Face import is `models.hf`.

A checkpoint directory holds `model_config.json` and `params/`, Orbax's files for the params tree: its tree
metadata (`_METADATA`) and, in Orbax's OCDBT layout (what `save_checkpoint` writes), a database of the arrays
(`manifest.ocdbt` and its data files under `d/`) at the top and one per writing process
(`ocdbt.process_<i>/`). Opening a checkpoint (`read_config`) checks these are there, so a damaged one is
named in one line before anything is read; a data file that is there but unreadable is named when the
arrays are restored.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os

from models.config import ModelConfigError
from models.params import Params, abstract_params, check_params
from models.presets import config_type


class CheckpointError(ValueError):
    """A checkpoint that cannot be read: missing files or tensors, misshaped tensors, unknown architecture."""


def save_checkpoint(path: str, params: Params, cfg) -> None:
    """Write params (Orbax) and `model_config.json` (the config's family and fields) under directory `path`
    (created; must not exist).
    Raises ValueError naming a tensor that is missing, extra or misshaped for `cfg`."""
    path = os.path.abspath(path)
    check_params(params, cfg)
    import orbax.checkpoint as ocp  # here, not at import: most processes never save or restore
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(os.path.join(path, "params"), params)
    with open(os.path.join(path, "model_config.json"), "w") as f:
        json.dump({"family": cfg.family_name(), **dataclasses.asdict(cfg)}, f, indent=1)


def read_config(path: str):
    """The config `save_checkpoint` wrote under `path`, of the family model_config.json records (one
    without a `family`, written before it was recorded: the config type whose fields it holds, see
    `models.presets.config_type`), without reading any tensor. Raises CheckpointError when there is
    none, it names an unknown family or a field the config does not have, or a file of the params is
    missing (`check_files`)."""
    path = os.path.abspath(path)
    try:
        with open(os.path.join(path, "model_config.json")) as f:
            fields = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is not a dualjax checkpoint (no model_config.json)") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}/model_config.json is not JSON: {e}") from None
    family = fields.pop("family", None) if isinstance(fields, dict) else None
    try:
        cfg = config_type(fields, family).from_fields(fields)
    except (TypeError, ModelConfigError) as e:  # an unknown family or field, or a needed field absent
        raise CheckpointError(f"{path}/model_config.json: {e}") from None
    check_files(path)
    return cfg


def check_files(path: str) -> None:
    """Raise CheckpointError naming every file or directory of the Orbax params under checkpoint `path` that
    is missing (see the module doc); reads directory listings only."""
    root = os.path.join(path, "params")
    if not os.path.isdir(root):
        raise CheckpointError(f"damaged checkpoint {path}: no params/ directory (its arrays)")
    missing = [] if os.path.isfile(os.path.join(root, "_METADATA")) else ["params/_METADATA"]
    if os.path.exists(os.path.join(root, "manifest.ocdbt")):  # the OCDBT layout: databases of the arrays
        databases = [root, *sorted(glob.glob(os.path.join(root, "ocdbt.process_*")))]
        if len(databases) == 1:
            missing.append("params/ocdbt.process_*/")
        for db in databases:
            name = os.path.relpath(db, path)
            if not os.path.isfile(os.path.join(db, "manifest.ocdbt")):
                missing.append(f"{name}/manifest.ocdbt")
            if not (os.path.isdir(os.path.join(db, "d")) and os.listdir(os.path.join(db, "d"))):
                missing.append(f"{name}/d/")
    if missing:
        raise CheckpointError(f"damaged checkpoint {path}: missing or empty {', '.join(missing)} (Orbax's "
                              f"files of its params)")


def restore_checkpoint(path: str, shardings=None):
    """Read what `save_checkpoint` wrote -> (config, params); params land on `shardings` when given.

    Raises CheckpointError naming a tensor the stored params lack, hold extra, or hold in another shape."""
    path = os.path.abspath(path)
    cfg = read_config(path)
    import orbax.checkpoint as ocp  # here, not at import: most processes never save or restore
    with ocp.StandardCheckpointer() as ckptr:
        stored = ckptr.metadata(os.path.join(path, "params"))
        try:  # name a missing, extra or misshaped tensor before Orbax reports a tree mismatch
            check_params(getattr(stored, "item_metadata", stored), cfg)
        except ValueError as e:
            raise CheckpointError(f"{path}: {e}") from None
        try:
            params = ckptr.restore(os.path.join(path, "params"), abstract_params(cfg, shardings))
        except Exception as e:  # Orbax and TensorStore raise several types for a damaged file
            raise CheckpointError(f"damaged checkpoint {path}: its params cannot be read: {_innermost(e)}") from None
    return cfg, params


def _innermost(e: BaseException) -> str:
    """The first line of the error at the bottom of `e`'s chain (TensorStore's, naming the array and file)."""
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
