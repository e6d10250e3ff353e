"""Every family's config type and presets in one registry (imports without JAX): `get_config` and the
preset names for `--model`, the registered families (`families`), and the config type a checkpoint's
`model_config.json` belongs to. A new family adds its config type and presets here."""

from __future__ import annotations

import dataclasses

from models.config import ModelConfigError, UnknownPreset, family_of
from models.deepseek.config import PRESETS as DEEPSEEK_PRESETS
from models.deepseek.config import DeepSeekConfig
from models.dense.config import PRESETS as DENSE_PRESETS
from models.dense.config import ModelConfig

CONFIG_TYPES = (ModelConfig, DeepSeekConfig)  # one per family
PRESETS = {**DENSE_PRESETS, **DEEPSEEK_PRESETS}


def get_config(name: str, **overrides):
    """The preset called `name` of any family, with optional field overrides. Raises UnknownPreset
    (a KeyError) naming every preset for an unknown name."""
    if name not in PRESETS:
        raise UnknownPreset(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]


def preset_names() -> list[str]:
    return list(PRESETS)


def families() -> list:
    """The family object (`models.family.Family`) of every registered config type; loads JAX."""
    return [family_of(t) for t in CONFIG_TYPES]


def config_type(fields: dict, family: str | None = None) -> type:
    """The config type of a checkpoint's model_config.json: that of the `family` it records (the config
    type's `family_name()`). Without one (a checkpoint written before the family was recorded), the
    fallback: the config type whose fields `fields` share the most. Raises ModelConfigError for a family
    that is not registered, naming those that are."""
    if family is None:
        return max(CONFIG_TYPES, key=lambda t: len(set(fields) & {f.name for f in dataclasses.fields(t)}))
    by_name = {t.family_name(): t for t in CONFIG_TYPES}
    if family not in by_name:
        raise ModelConfigError(f"unknown model family {family!r}; families: {', '.join(by_name)}")
    return by_name[family]
