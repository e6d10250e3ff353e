"""The dense GQA family's object (`cfg.family` of a `ModelConfig`)."""

from models.dense import hf, model
from models.family import Family

FAMILY = Family(
    name="dense", tiny_preset="tiny", declare=model.declare,
    forward_layer=model.forward_layer, decode_layer=model.decode_layer,
    cache_layout=model.cache_layout, kv_axes=model.KV_AXES, reference_logits=model.reference_logits,
    attention=model.attention, hf_names=tuple(hf.ARCHITECTURES), hf_config=hf.hf_config, load_hf=hf.load_hf,
    export_hf=hf.export_hf)
