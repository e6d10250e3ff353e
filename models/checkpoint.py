"""Orbax checkpoints of any family: the params with the config's fields beside them (`model_config.json`).
Hugging Face import is `models.hf`."""

from __future__ import annotations

import dataclasses
import json
import os

from models.params import Params, abstract_params, check_params
from models.presets import config_type


class CheckpointError(ValueError):
    """A checkpoint that cannot be read: missing or misshaped tensors, unknown architecture."""


def save_checkpoint(path: str, params: Params, cfg) -> None:
    """Write params (Orbax) and `model_config.json` under directory `path` (created; must not exist).
    Raises ValueError naming a tensor that is missing, extra or misshaped for `cfg`."""
    path = os.path.abspath(path)
    check_params(params, cfg)
    import orbax.checkpoint as ocp  # here, not at import: most processes never save or restore
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(os.path.join(path, "params"), params)
    with open(os.path.join(path, "model_config.json"), "w") as f:
        json.dump(dataclasses.asdict(cfg), f, indent=1)


def read_config(path: str):
    """The config `save_checkpoint` wrote under `path` (any family: the config type whose fields it
    holds), without reading any tensor. Raises CheckpointError when there is none or it names a field
    the config does not have."""
    path = os.path.abspath(path)
    try:
        with open(os.path.join(path, "model_config.json")) as f:
            fields = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is not a dualjax checkpoint (no model_config.json)") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}/model_config.json is not JSON: {e}") from None
    try:
        return config_type(fields).from_fields(fields)
    except TypeError as e:  # a field this version does not know, or one it needs that is absent
        raise CheckpointError(f"{path}/model_config.json: {e}") from None


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
        params = ckptr.restore(os.path.join(path, "params"), abstract_params(cfg, shardings))
    return cfg, params
