"""Placement and devices: SLURM host lists expand as SLURM expands them, nodes take roles in the
order listed (one role per node, the scheduler beside the first), ranks find their seats by hostname
whatever order a launcher numbers them in, and engines sharing a node split its devices."""

import pytest

from dualjax.core.config import ClusterSpec
from dualjax.runtime.cluster.devices import device_env
from dualjax.runtime.cluster.placement import (
    Node,
    Placement,
    PlacementError,
    Seat,
    expand_hostlist,
    parse_hostfile,
    read_nodes,
)


@pytest.mark.parametrize("text,names", [
    ("n1", ["n1"]),
    ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
    ("gpu[08-10,15],login1", ["gpu08", "gpu09", "gpu10", "gpu15", "login1"]),
    ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
    ("a[9-11].ib,b", ["a9.ib", "a10.ib", "a11.ib", "b"]),
])
def test_slurm_host_lists_expand_in_order(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["gpu[01-03", "gpu]1[", "gpu[3-1]", "gpu[a-b]"])
def test_a_bad_slurm_host_list_is_one_error(text):
    with pytest.raises(PlacementError, match="bad host"):
        expand_hostlist(text)


def test_a_hostfile_gives_nodes_and_slots():
    text = "# our nodes\nnode-a\n\nnode-b:2   # two engines\n"
    assert parse_hostfile(text) == [Node("node-a", 1), Node("node-b", 2)]
    with pytest.raises(PlacementError, match="line 1"):
        parse_hostfile("node-a:0")
    with pytest.raises(PlacementError, match="node-a is listed twice"):
        parse_hostfile("node-a\nnode-a")


def test_slurm_nodes_come_from_the_allocation():
    nodes, source = read_nodes("slurm", {"SLURM_JOB_NODELIST": "gpu[1-3]"})
    assert [n.name for n in nodes] == ["gpu1", "gpu2", "gpu3"] and "gpu[1-3]" in source
    with pytest.raises(PlacementError, match="SLURM_JOB_NODELIST is not set"):
        read_nodes("slurm", {})


def roles(p: Placement) -> list[tuple[str, str]]:
    return [(s.role, s.host) for s in p.seats]


def test_each_node_has_one_role_and_the_scheduler_shares_the_first():
    p = Placement.plan(ClusterSpec(2, 4), [Node(f"n{i}") for i in range(6)])
    assert roles(p) == [("scheduler", "n0"), ("prefill", "n0"), ("prefill", "n1"),
                        ("decode", "n2"), ("decode", "n3"), ("decode", "n4"), ("decode", "n5")]
    assert p.hydra_hosts() == "n0:2,n1:1,n2:1,n3:1,n4:1,n5:1"
    assert p.report() == {"scheduler": "n0", "prefill": ["n0", "n1"], "decode": ["n2", "n3", "n4", "n5"],
                          "spare": []}


def test_a_spare_node_is_the_schedulers_own():
    p = Placement.plan(ClusterSpec(1, 2), [Node(f"n{i}") for i in range(5)])
    assert roles(p) == [("scheduler", "n0"), ("prefill", "n1"), ("decode", "n2"), ("decode", "n3")]
    assert p.spare == ("n4",)


def test_a_node_of_several_slots_runs_several_engines():
    p = Placement.plan(ClusterSpec(1, 1), [Node("box", 3)])
    assert roles(p) == [("scheduler", "box"), ("prefill", "box"), ("decode", "box")]
    assert [(s.local_index, s.local_engines) for s in p.seats[1:]] == [(0, 2), (1, 2)]


def test_too_few_nodes_is_refused_naming_the_source():
    with pytest.raises(PlacementError, match=r"hostfile h has 3 nodes with 3 engine slots; cluster 2p2d needs 4"):
        Placement.plan(ClusterSpec(2, 2), [Node("a"), Node("b"), Node("c")], "hostfile h")


def test_ranks_find_their_seats_by_hostname_in_any_launch_order():
    p = Placement.plan(ClusterSpec(1, 2), [Node("a"), Node("b"), Node("c")])  # a: scheduler + PE
    # a launcher that numbers round-robin over the hosts, and one with fully qualified names
    assert p.assign(["b", "a", "c", "a"]) == [2, 0, 3, 1]
    assert p.assign(["a.x", "c.x", "a.x", "b.x"]) == [0, 3, 1, 2]


@pytest.mark.parametrize("names,error", [
    (["a", "a", "b"], "needs 4 ranks"),
    (["a", "b", "b", "c"], "host a runs 1 rank; the placement puts 2 there"),
    (["a", "a", "b", "z"], "host z runs a rank but is not in the placement"),
])
def test_ranks_that_do_not_match_the_placement_are_refused(names, error):
    p = Placement.plan(ClusterSpec(1, 2), [Node("a"), Node("b"), Node("c")])
    with pytest.raises(PlacementError, match=error):
        p.assign(names)


def seat(role="prefill", k=0, n=1):
    return Seat(1, role, "h", k, n)


def test_the_scheduler_takes_no_device():
    assert device_env(seat("scheduler"), {}) == {"JAX_PLATFORMS": "cpu"}
    assert device_env(seat("scheduler"), {"JAX_PLATFORMS": "cuda"}) == {}


def test_engines_sharing_a_node_split_its_gpus():
    gpus = [str(i) for i in range(8)]
    assert device_env(seat(n=1), {}, gpus) == {}
    assert [device_env(seat(k=k, n=2), {}, gpus) for k in range(2)] == [
        {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}]
    # SLURM (or the user) gave this rank four GPUs: it splits those
    assert device_env(seat(k=1, n=2), {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == {"CUDA_VISIBLE_DEVICES": "6,7"}


def test_engines_sharing_a_gpu_preallocate_a_share_of_it():
    half = {"CUDA_VISIBLE_DEVICES": "0", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.375"}
    assert device_env(seat(k=1, n=2), {}, ["0"]) == half
    assert device_env(seat(k=2, n=3), {}, ["0", "1"]) == half  # GPU 0 runs engines 0 and 2
    assert device_env(seat(k=1, n=2), {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, ["0"]) == {
        "CUDA_VISIBLE_DEVICES": "0"}


def test_engines_sharing_a_cpu_node_split_its_cpu_devices():
    flags = "--xla_cpu_foo=1 --xla_force_host_platform_device_count=4"
    assert device_env(seat(k=0, n=2), {"XLA_FLAGS": flags}, []) == {
        "XLA_FLAGS": "--xla_cpu_foo=1 --xla_force_host_platform_device_count=2"}
    assert device_env(seat(k=1, n=2), {"JAX_NUM_CPU_DEVICES": "4"}, []) == {"JAX_NUM_CPU_DEVICES": "2"}
    assert device_env(seat(k=1, n=2), {}, []) == {}
