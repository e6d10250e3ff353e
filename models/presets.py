"""Every family's config type and presets in one registry (imports without JAX): `get_config` and the
preset names for `--model`, and the config type a checkpoint's fields belong to. A new family adds its
config type and presets here."""

from __future__ import annotations

import dataclasses

from models.config import UnknownPreset
from models.deepseek.config import PRESETS as DEEPSEEK_PRESETS
from models.deepseek.config import DeepSeekConfig
from models.dense.config import PRESETS as DENSE_PRESETS
from models.dense.config import ModelConfig

CONFIG_TYPES = (ModelConfig, DeepSeekConfig)
PRESETS = {**DENSE_PRESETS, **DEEPSEEK_PRESETS}


def get_config(name: str, **overrides):
    """The preset called `name` of any family, with optional field overrides. Raises UnknownPreset
    (a KeyError) naming every preset for an unknown name."""
    if name not in PRESETS:
        raise UnknownPreset(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]


def preset_names() -> list[str]:
    return list(PRESETS)


def config_type(fields: dict) -> type:
    """The config type whose fields `fields` (a checkpoint's model_config.json) share the most."""
    return max(CONFIG_TYPES, key=lambda t: len(set(fields) & {f.name for f in dataclasses.fields(t)}))
