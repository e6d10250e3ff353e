"""`bench kvstore`: the keys other tools read and a wall-time bound that bounds its trials."""

from dualjax.bench import kvstore


def test_quick(tmp_path):
    """The keys other tools read, the checksum floor beside the raw read (the same bytes, checked),
    and a spent wall-time bound (--max-wall-s 0) stops each phase's trials after two."""
    result = kvstore.main(["--quick", "--max-wall-s", "0", "--dir", str(tmp_path), "--json", str(tmp_path / "kv.json")])
    assert result["read_trials"] == result["read_cold_trials"] == result["write_trials"] == 2
    assert {"read_vs_raw", "write_vs_raw", "cap_measured_mbps", "cap_target_mbps", "raw_checked_vs_raw",
            "read_vs_raw_checked", "read_layer_major_nic_vs_raw", "read_layer_major_nic_cold_vs_raw"} <= set(result)
    assert result["raw_read_checked_gbps"] > 0 and result["read_vs_raw_checked"] > 0
    assert result["read_layer_major_nic_cold_gbps"] > 0
    assert result["qwen2.5-32b"]["read_layer_major_nic_cold_vs_raw"] > 0
    direct = result["raw_read_cold_direct_gbps"]  # the raw O_DIRECT read, where the file system has it
    assert (direct is None) == (result["read_cold_vs_raw_direct"] is None) and (direct is None or direct > 0)
    assert result["cap_target_mbps"] == 100.0


def test_each_phase_gets_its_share_of_the_wall_time_left():
    """--max-wall-s is one bound on the whole benchmark: a phase gets the time left in proportion to its
    weight among the phases still to run, so a phase that ends early leaves its time to the others."""
    now = [0.0]
    share = kvstore.Shares(70.0, clock=lambda: now[0])
    assert sum(kvstore.PHASES.values()) == 7.0
    assert share("reads") == 10.0  # per unit of weight: 10 s of warm reads, 5 s of cold ones
    now[0] = 5.0  # they took 5 s, not 15: the other phases (5.5 units) share the 65 s left
    assert share("writes") == 65.0 / 5.5
    now[0] = 80.0  # past the bound: no trial beyond each phase's least
    assert share("reads qwen2.5-32b") == 0.0
