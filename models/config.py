"""What every family's config shares: the dtype table, config errors, and `FamilyConfig`, the base of
each family's frozen config dataclass (imports without JAX).

Shape legend used across `models/`: B batch, T new tokens, S cached tokens, C decode-cache capacity,
D model, N query heads, K kv heads, H head dim, F ffw, V vocab, L layers; each family adds its own
(`models.deepseek.config`).

A config names its family (`FAMILY`, a package under `models/`) and reaches it through `cfg.family`,
which loads the family's JAX code on first use; its cost terms (`cfg.cost_terms()`), its serving
costs (`cfg.serving_costs()`: what the simulator asks a family) and everything the store needs
(`kv_record_shape`, `kv_dtype`, `kv_format`) stay JAX-free.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import ClassVar

import ml_dtypes
import numpy as np


class ModelConfigError(ValueError):
    """A bad model config or an unknown preset name; the message names the field or the presets."""


class UnknownPreset(ModelConfigError, KeyError):
    def __str__(self) -> str:
        return self.args[0]


# The one table of model dtypes, as NumPy dtypes (JAX takes these directly; ml_dtypes is what
# jnp.bfloat16 is). Every dtype name in `models/` (configs, checkpoints, caches) is a key here.
DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}
KV_DTYPES = {**DTYPES, "uint8": np.dtype(np.uint8)}  # a cache record may be raw bytes (DeepSeek's FP8 layout)


class FamilyConfig:
    """Mixed into each family's frozen config dataclass. Subclasses set `FAMILY` (the family's package:
    its `family` module holds the family object, its `costs` module the JAX-free `cost_terms` and
    `serving_costs`) and define
    `dtype`, `n_layers`, `kv_record_shape`, `kv_dtype` and `kv_format`."""

    FAMILY: ClassVar[str]

    @property
    def family(self):
        """The family object of this config (`models.family.Family`); loads JAX on first use."""
        return family_of(type(self))

    @classmethod
    def family_name(cls) -> str:
        """The family's name, its package's (`dense`, `deepseek`), without JAX: what a checkpoint records."""
        return cls.FAMILY.rpartition(".")[2]

    def cost_terms(self):
        """The terms of this config's cost model (`models.costs.CostTerms`), without JAX."""
        return importlib.import_module(f"{self.FAMILY}.costs").cost_terms(self)

    def serving_costs(self):
        """What serving this model costs as its family deploys it (`models.costs.ServingCosts`), without JAX."""
        return importlib.import_module(f"{self.FAMILY}.costs").serving_costs(self)

    @classmethod
    def from_fields(cls, fields: dict):
        """The config from its fields as `dataclasses.asdict` wrote them (a checkpoint's model_config.json)."""
        return cls(**fields)

    @property
    def jnp_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    @property
    def kv_np_dtype(self) -> np.dtype:
        """The NumPy dtype of the cache record (`kv_dtype`)."""
        return KV_DTYPES[self.kv_dtype]

    @property
    def kv_record_bytes(self) -> int:
        """Bytes of one token's record for one layer."""
        return math.prod(self.kv_record_shape) * self.kv_np_dtype.itemsize

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def family_of(config_type: type):
    """The family object of a config type (its package's `family.FAMILY`)."""
    return importlib.import_module(f"{config_type.FAMILY}.family").FAMILY
