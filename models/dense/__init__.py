"""The dense GQA family (Llama / Qwen2): its config and presets here (JAX-free); its model in `model`,
its Hugging Face mapping in `hf`, its family object in `family`, its cost terms in `costs`."""

from models.dense.config import PRESETS, ModelConfig, RopeScaling

__all__ = ["PRESETS", "ModelConfig", "RopeScaling"]
