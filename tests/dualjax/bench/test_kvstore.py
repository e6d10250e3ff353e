"""`bench kvstore`: the keys other tools read and a budget that bounds its trials."""

from dualjax.bench import kvstore


def test_quick(tmp_path):
    """The keys other tools read, the checksum floor beside the raw read (the same bytes, checked),
    and a spent budget stops each phase's trials after two."""
    result = kvstore.main(["--quick", "--budget-s", "0", "--dir", str(tmp_path), "--json", str(tmp_path / "kv.json")])
    assert result["read_trials"] == result["read_cold_trials"] == result["write_trials"] == 2
    assert {"read_vs_raw", "write_vs_raw", "cap_measured_mbps", "cap_target_mbps", "raw_checked_vs_raw",
            "read_vs_raw_checked", "read_layer_major_nic_vs_raw", "read_layer_major_nic_cold_vs_raw"} <= set(result)
    assert result["raw_read_checked_gbps"] > 0 and result["read_vs_raw_checked"] > 0
    assert result["read_layer_major_nic_cold_gbps"] > 0
    assert result["qwen2.5-32b"]["read_layer_major_nic_cold_vs_raw"] > 0
    direct = result["raw_read_cold_direct_gbps"]  # the raw O_DIRECT read, where the file system has it
    assert (direct is None) == (result["read_cold_vs_raw_direct"] is None) and (direct is None or direct > 0)
    assert result["cap_target_mbps"] == 100.0
