"""The DeepSeek-V3.2 family's object (`cfg.family` of a `DeepSeekConfig`)."""

from models.deepseek import hf, model, reference
from models.family import Family

FAMILY = Family(
    name="deepseek", tiny_preset="deepseek-tiny", declare=model.declare,
    forward_layer=model.forward_layer, decode_layer=model.decode_layer,
    cache_layout=model.cache_layout, kv_axes=model.KV_AXES, reference_logits=reference.reference_logits,
    attention=model.attention, hf_names=hf.MODEL_TYPES, hf_config=hf.hf_config, load_hf=hf.load_hf,
    export_hf=hf.export_hf)
