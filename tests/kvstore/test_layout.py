"""The block layout holds any per-token cache record; a store refuses another record format."""

import pathlib

import numpy as np
import pytest

import kvstore as kv
import models
from dualjax.runtime.store import layout_for

RECORDS = {  # record format -> (record shape, dtype): GQA K/V, an MLA-like latent + RoPE key, packed bytes
    "gqa:2x2x16:float32": ((2, 2, 16), "float32"),
    "mla:latent32+rope8:bfloat16": ((40,), "bfloat16"),
    "packed:fp8+scales:uint8": ((132,), "uint8"),
}


def _layout(fmt, **kw):
    shape, dtype = RECORDS[fmt]
    return kv.BlockLayout(n_layers=3, record_shape=shape, dtype=dtype, format=fmt, block_tokens=16, **kw)


@pytest.mark.parametrize("fmt", sorted(RECORDS))
def test_any_record_round_trips_bit_exact_and_layers_are_contiguous_slices(fmt):
    layout = _layout(fmt)
    assert layout.full_shape == (3, 16, *RECORDS[fmt][0]) and layout.layer_shape == layout.full_shape[1:]
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (4, layout.block_bytes), np.uint8)
    blocks = raw.view(layout.np_dtype).reshape(4, *layout.full_shape)
    ids = kv.block_chain(np.arange(4 * 16), layout)
    with kv.BlockStore("memory://", layout) as s:
        assert s.put(ids, blocks) == 4
        got = np.stack(s.get_prefix([b.hash for b in ids]))
        one = s.get([ids[1].hash], layers=range(1, 2))[0].result()
    np.testing.assert_array_equal(got.view(np.uint8), blocks.view(np.uint8))
    np.testing.assert_array_equal(one[1].view(np.uint8), blocks[1, 1].view(np.uint8))
    assert all(blocks[0, layer].flags.c_contiguous for layer in range(3))
    assert layout.layer_bytes * 3 == layout.block_bytes == blocks[0].nbytes


def test_store_of_another_record_format_is_refused_naming_both(tmp_path):
    a, b = "gqa:2x2x16:float32", "mla:latent32+rope8:bfloat16"
    spec = kv.local_spec(tmp_path / "s")
    kv.BlockStore(spec, _layout(a)).close()
    with pytest.raises(kv.FingerprintMismatch) as e:
        kv.BlockStore(spec, _layout(b))
    assert a in str(e.value) and b in str(e.value)
    same_shape = kv.BlockLayout(**{**_layout(a).to_json(), "format": "gqa:2x2x16:float32 weights=other"})
    with pytest.raises(kv.FingerprintMismatch, match="weights=other"):
        kv.BlockStore(spec, same_shape)


def test_layout_json_round_trip_and_bad_fields():
    layout = _layout("mla:latent32+rope8:bfloat16", hash_seed=3)
    assert kv.BlockLayout.from_json(layout.to_json()) == layout
    assert kv.BlockLayout.from_json(layout.to_json()).fingerprint() == layout.fingerprint()
    for bad in ({"record_shape": ()}, {"record_shape": (2, 0)}, {"dtype": "complex-ish"}, {"n_layers": 0}):
        with pytest.raises(ValueError, match="BlockLayout"):
            kv.BlockLayout(**{"n_layers": 1, "record_shape": (4,), **bad})


def test_model_layout_comes_from_the_configs_record_and_names_model_and_weights():
    cfg = models.get_config("tiny")
    layout = layout_for(cfg, block_tokens=32)
    assert layout.record_shape == cfg.kv_record_shape == (2, cfg.n_kv_heads, cfg.head_dim)
    assert layout.full_shape == (cfg.n_layers, 32, *cfg.kv_record_shape) and layout.dtype == cfg.kv_dtype
    assert cfg.kv_format in layout.format and "tiny" in layout.format
    assert layout_for(cfg, weights="sha256:ab").fingerprint() != layout_for(cfg).fingerprint()
    assert layout.layer_bytes == models.kv_bytes_per_token(cfg) // cfg.n_layers * 32


def test_kvstore_names_no_model():
    src = " ".join(p.read_text() for p in pathlib.Path(kv.__file__).parent.glob("*.py"))
    for word in ("n_kv_heads", "head_dim", "import models", "from models", "llama", "qwen", "deepseek"):
        assert word not in src.lower(), word
