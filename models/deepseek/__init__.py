"""The DeepSeek-V3.2 family (MLA, DSA, MoE, FP8 cache record): its config and presets here (JAX-free);
its model in `model` (with `mla`, `dsa`, `moe` and the cache `record`), its Hugging Face mapping in `hf`,
a NumPy reference in `reference`, its family object in `family`, its cost terms in `costs`."""

from models.deepseek.config import PRESETS, DeepSeekConfig

__all__ = ["PRESETS", "DeepSeekConfig"]
