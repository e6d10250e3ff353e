"""Cluster specs: the role of each rank."""

import pytest

from dualjax.core.config import ClusterSpec, ConfigError


def test_cluster_roles():
    """Rank 0 schedules, the next P ranks prefill, the last D decode."""
    c = ClusterSpec.parse("2P3D")
    assert (c.size, c.prefill_ranks, c.decode_ranks, c.role(0), c.role(2), c.role(3)) == \
        (6, [1, 2], [3, 4, 5], "scheduler", "prefill", "decode")
    with pytest.raises(ConfigError):
        c.role(6)
