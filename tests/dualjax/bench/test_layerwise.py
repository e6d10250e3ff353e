"""`bench layerwise`: one measurement on a 4-layer tiny model."""

import models
from dualjax.bench import layerwise
from dualjax.plots import plot_layerwise


def test_measure(tmp_path, monkeypatch):
    """`bench layerwise`'s measurement on a 4-layer tiny model: the keys other tools read, at most
    2.5 layers of prefix KV on the device at once (a pass holding every layer has 4), a spent
    budget stops the trials after two, and the timeline puts each layer's compute after its read
    (and is drawn)."""
    monkeypatch.chdir(tmp_path)  # its store's temp directory goes under the working directory
    cfg = models.get_config("tiny").replace(n_layers=4)
    result = layerwise.measure(cfg, hit_tokens=256, miss=32, trials=5, budget_s=0)
    assert result["trials"] == 2
    assert {"overlap_efficiency", "overlap_efficiency_of_medians", "overlap_ideal", "peak_kv_layers",
            "layerwise_vs_basic"} <= set(result)
    assert result["overlap_ideal"] == cfg.n_layers / (cfg.n_layers + 1)
    assert 0 < result["overlap_efficiency"] and 0 < result["peak_kv_layers"] <= 2.5
    assert result["load_s"] > 0 and result["compute_s"] > 0
    tl = result["timeline"]
    assert len(tl["read_s"]) == len(tl["computed_s"]) == cfg.n_layers
    assert 0 < tl["read_s"][0] and all(a <= b for a, b in zip(tl["read_s"], tl["read_s"][1:]))
    assert all(r < c for r, c in zip(tl["read_s"], tl["computed_s"])) and tl["computed_s"][-1] <= tl["layerwise_s"]
    assert 0 < tl["basic_read_s"] < tl["basic_s"]
    plot_layerwise(str(tmp_path / "lw.png"), {"model": cfg.name, **result, "small_16_layers": result})
    assert (tmp_path / "lw.png").stat().st_size > 0
