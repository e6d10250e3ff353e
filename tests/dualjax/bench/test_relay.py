"""`bench relay`: the keys other tools read, its baselines from the same job, and the relay's speed
where MPI moves bytes only inside its calls."""

import pytest

from dualjax.bench import relay


@pytest.mark.slow
def test_quick(tmp_path):
    """Its baseline (a plain Send) ran in the same job, every run received into one pool, reusing
    its buffers, and each control lane's p99 rests on enough pings to be a percentile rather than
    the maximum of a few."""
    result = relay.main(["--quick", "--json", str(tmp_path / "relay.json")])
    assert {"relay_vs_raw", "control_p99_ms_priority", "control_p99_ms_fifo", "raw_gbps"} <= set(result)
    assert result["raw_gbps"] > 0 and result["relay_vs_raw"] > 0 and result["relay_vs_raw_fresh_pool"] > 0
    assert result["pool_reuses"] > 10 * result["pool_buffers"] > 0, result  # one pool served every run
    # the second yardstick lands in as many buffers as the relay's pool had after its warm-up
    assert 1 <= result["raw_same_buffers"] <= result["pool_buffers"] and result["relay_vs_raw_same_buffers"] > 0
    assert min(result["control_messages"]) >= 100 * relay.LATENCY_ROUNDS, result["control_messages"]
    rounds = result["control_p99_ms_priority_rounds"], result["control_p99_ms_fifo_rounds"]
    assert len(rounds[0]) == len(rounds[1]) == relay.LATENCY_ROUNDS


@pytest.mark.slow
@pytest.mark.timing
def test_without_cma(tmp_path, monkeypatch):
    """Without single-copy transfers (MPICH turns CMA off under Yama's ptrace_scope >= 1, the default
    of many distributions) a shared-memory transfer moves only while its ranks are inside MPI calls.
    A progress thread that slept between polls while KV was in flight relayed 1/100 of a plain Send;
    one that waits inside MPI keeps up with it, and so does its sender, told by the receiver."""
    monkeypatch.setenv("MPIR_CVAR_CH4_CMA_ENABLE", "0")
    result = relay.main(["--quick", "--json", str(tmp_path / "relay.json")])
    assert result["waits_inside_mpi"], "the transport did not see its KV stall between polls"
    assert all(result["waits_inside_mpi_ranks"]), "the receiver did not tell its sender"
    assert result["relay_vs_raw"] > 0.25 and result["relay_strided_vs_raw"] > 0.25, result
