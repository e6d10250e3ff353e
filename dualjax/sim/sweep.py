"""Sweeps: many simulations at once, on every local core, resumable (`dualjax sim sweep`, docs/sweep.md).

    from dualjax.sim.sweep import grid, sweep
    points = grid(["dualpath", "pe-only"], regimes=["storage-starved", "balanced"], seeds=[0, 1])
    result = sweep(points, "runs/sweep")  # OUT/<point-id>/{requests.parquet,report.json}, OUT/summary.parquet

A grid is the product of its axes (policies x workloads x clusters x storage rates x hardware x seeds),
or of named regimes (`REGIMES`: hardware, model, cluster and storage rate fixed) x policies x workloads x
seeds. Each point is one `simulate` run whose outputs go to `OUT/<point-id>/` as `dualjax sim --out`
writes them, with `point.json` (its settings and wall time) beside them; a point's directory appears
whole or not at all (written under `OUT/.partial/`, then renamed), so a point whose directory exists is
done and a sweep started again skips it and reads its row back. `OUT/summary.parquet` holds one row per
point (`COLUMNS`), each with its policy's JCT relative to the best policy of its regime.

Points run in a process pool (`jobs`, default every core this process may use): simulations are
single-threaded and independent, so N cores finish about N points at once. `run_tasks` is the pool;
`dualjax sim paper` runs its points (and its online and capacity searches, `Call`) through it too. Across
MPI ranks, `share` splits the points between ranks (`dualjax.cli.sweep` does the MPI part: this package
imports no MPI).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import multiprocessing
import os
import re
import shutil
import sys
import time
import traceback
from typing import Any, Callable

from dualjax.core.config import ClusterSpec, ConfigError, SimConfig
from dualjax.core.policies import Policy, get_policy
from dualjax.core.workload import PRESETS, get_workload
from dualjax.outputs import REPORT, TABLE
from dualjax.sim import simulate
from dualjax.sim.profiles import Hardware, get_hardware, model_cost

POINT_FILE, RESULT_FILE, SUMMARY = "point.json", "result.json", "summary.parquet"
CODE_FILE = "code"  # a Call's `code_digest` beside its result
PARTIAL, FAILED = ".partial", "failed"


class SweepError(ConfigError):
    """A bad grid: an empty or repeated axis value, a regime with flags it fixes, an unknown regime."""


# -- regimes -------------------------------------------------------------------------------------------

# Workloads across hit rates: the `hit-*` presets (dualjax/core/workload.py; docs/workloads.md says how each
# is made) and paper-64k (the paper's agentic trace shape, ~98.7 % of prompt tokens hit). A regime takes the
# ones this dualjax has.
HIT_WORKLOADS = ("hit-65", "hit-85", "hit-95", "paper-64k")


@dataclasses.dataclass(frozen=True)
class Regime:
    """Named settings (`dualjax sim sweep --regimes NAME`): everything but the policy, workload and seed."""

    name: str
    hardware: str
    model: str
    cluster: str
    snic_mbps: float | None  # per node; None: the profile's (paper-h800: 400 Gbps x its fitted storage efficiency)
    how: str  # how it is made, for docs/sweep.md and --help
    workloads: tuple[str, ...] = HIT_WORKLOADS

    def available_workloads(self) -> tuple[str, ...]:
        return tuple(w for w in self.workloads if w in PRESETS or not _is_preset_name(w))


def _is_preset_name(name: str) -> bool:
    return not (name.endswith(".jsonl") or ":" in name)


# DeepSeek-V3.2 on paper-h800 (2P4D): a hit token is 40 KB of KV (FP8 latent + indexer keys, 61 layers), and
# recomputing an agent's long context costs a PE far more than its new tokens. The rate is per node; a shared
# tier of B bytes/s over the 6 nodes gives each about B / 6. Where loading every hit and recomputing every
# prompt cross, measured on 2P4D x 64 agents of paper-64k (docs/sweep.md), fixes the balanced rate.
REGIMES: dict[str, Regime] = {r.name: r for r in (
    Regime("compute-starved", "paper-h800", "deepseek-v3.2", "2p4d", None,
           "the paper's setting: 2P4D of paper-h800 as fitted, DeepSeek-V3.2, each node's 400 Gbps storage NIC "
           "at its fitted efficiency (18.7 GB/s per node delivered): loading beats recomputing by ~10x"),
    Regime("balanced", "paper-h800", "deepseek-v3.2", "2p4d", 170.0,
           "2P4D of paper-h800, DeepSeek-V3.2, storage reads at 170 MB/s per node (a ~1 GB/s shared tier over "
           "6 nodes): loading every hit takes about as long as recomputing every prompt"),
    Regime("storage-starved", "paper-h800", "deepseek-v3.2", "2p4d", 100.0,
           "2P4D of paper-h800, DeepSeek-V3.2, storage reads at 100 MB/s per node (a 600 MB/s shared tier over "
           "6 nodes: a file-backed L3, a remote object store): loading every hit takes ~1.75x as long as "
           "recomputing every prompt"),
)}


# -- points ----------------------------------------------------------------------------------------------

def _canonical(x):
    """`x` as plain JSON for a stable hash: dataclasses as dicts, infinities as text, a policy object as its
    class and attributes."""
    if isinstance(x, Policy):
        return {"policy": policy_ref(x), "state": _canonical(dict(sorted(vars(x).items())))}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _canonical(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {str(k): _canonical(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_canonical(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return f"<{type(x).__module__}.{type(x).__qualname__}>"  # no repr: it may hold an address


def digest(x) -> str:
    return hashlib.sha1(json.dumps(_canonical(x), sort_keys=True).encode()).hexdigest()[:10]


def _digest_files(files: list[str], h=None):
    h = h or hashlib.sha1()
    for f in sorted(files):
        with open(f, "rb") as fh:
            h.update(f.encode() + b"\0" + fh.read())
    return h


@functools.cache
def _package_digest() -> str:
    """dualjax's and models' sources, read once per process (the code it runs was imported once too)."""
    import models
    files = []
    for pkg in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.dirname(models.__file__)):
        for d, _, names in os.walk(pkg):
            files += [os.path.join(d, n) for n in names if n.endswith(".py")]
    return _digest_files(files).hexdigest()


def code_digest(policy=None) -> str:
    """A digest of the code a point's result depends on: dualjax's sources, models' configs and cost terms, and
    the module of a policy object of the user's. A point done by other code is not done: resuming after an
    edit runs it again rather than reading back a result the code no longer gives."""
    files = []
    if policy is not None and not isinstance(policy, str):
        import inspect
        with contextlib.suppress(TypeError):  # a class defined in a notebook has no file: its state is in the id
            files.append(inspect.getfile(type(policy)))
    return _digest_files(files, hashlib.sha1(_package_digest().encode())).hexdigest()[:12]


def policy_ref(policy) -> str:
    """A policy's name as a grid shows it: a built-in's name, `module:Class` of an object's class (or the
    reference it was given as)."""
    if isinstance(policy, str):
        return policy
    cls = type(policy)
    from dualjax.core.policies import POLICIES
    return cls.name if POLICIES.get(cls.name) is cls else f"{cls.__module__}:{cls.__qualname__}"


def _slug(text: str, limit: int = 32) -> str:
    s = re.sub(r"[^A-Za-z0-9.+-]+", "_", str(text)).strip("_")
    return s[-limit:] if len(s) > limit else s


@dataclasses.dataclass(frozen=True)
class Point:
    """One simulation of a sweep: `config`, with `policy` (an object) and `hardware` (a profile object)
    overriding its names where given; `regime` and `label` name it in the summary."""

    config: SimConfig
    regime: str | None = None
    label: str | None = None
    hardware: Hardware | None = None
    policy: Policy | None = None

    @property
    def policy_name(self) -> str:
        return policy_ref(self.policy) if self.policy is not None else self.config.policy

    @property
    def hardware_name(self) -> str:
        return self.hardware.name if self.hardware is not None else self.config.hardware

    @property
    def id(self) -> str:
        """`<regime or cluster>_<policy>_<workload>_s<seed>_<hash>`: readable, and unique for its settings."""
        c = self.config
        where = self.label or self.regime or f"{c.cluster.name}-{self.hardware_name}-{_rate(c.snic_mbps)}"
        key = (c, self.regime, self.label, self.hardware, self.policy if self.policy is not None else None)
        return "_".join([_slug(where), _slug(self.policy_name), _slug(c.workload), f"s{c.workload_seed}", digest(key)])

    def settings(self) -> dict:
        """The point's settings as the summary shows them."""
        c = self.config
        return {"point": self.id, "regime": self.regime, "label": self.label, "policy": self.policy_name,
                "workload": c.workload, "cluster": c.cluster.name, "hardware": self.hardware_name, "model": c.model,
                "snic_mbps": c.snic_mbps, "seed": c.workload_seed, "agents": c.agents, "turns": c.turns,
                "aps": c.aps}

    def cost(self) -> float:
        """Roughly how long the point runs, to hand out the longest first: requests (agents x turns)."""
        c = self.config
        if c.workload in PRESETS:
            spec = get_workload(c.workload, agents=c.agents, turns=c.turns)
            return float(spec.agents * spec.turns)
        return float(c.agents or 1)

    def done(self, out: str) -> bool:
        d = os.path.join(out, self.id)
        if not all(os.path.exists(os.path.join(d, f)) for f in (REPORT, TABLE, POINT_FILE)):
            return False
        with open(os.path.join(d, POINT_FILE)) as f:
            return json.load(f).get("code") == code_digest(self.policy)

    def execute(self, tmp: str) -> dict:
        """Simulate, write the run's outputs and point.json into `tmp`; the summary row."""
        t0 = time.perf_counter()
        report = simulate(self.config, out=tmp, policy=self.policy, hardware=self.hardware, progress=False)
        wall = time.perf_counter() - t0
        with open(os.path.join(tmp, POINT_FILE), "w") as f:
            json.dump({"settings": self.settings(), "wall_s": wall, "key": _canonical(self.config),
                       "code": code_digest(self.policy)}, f, indent=1)
        return row(self, report, wall)

    def read(self, out: str) -> dict:
        """The summary row of a point done before, from its report.json and point.json."""
        d = os.path.join(out, self.id)
        with open(os.path.join(d, REPORT)) as f:
            report = json.load(f)
        with open(os.path.join(d, POINT_FILE)) as f:
            wall = json.load(f)["wall_s"]
        return row(self, report, wall)


def _rate(mbps: float | None) -> str:
    return "profile" if mbps is None else f"{mbps:g}MBps"


@dataclasses.dataclass(frozen=True)
class Call:
    """A task that is not one simulation (an online trial, a capacity search): `fn(*args)` in a worker, its
    JSON result kept in `OUT/<id>/result.json`. `fn` is a module-level function (it is pickled by name)."""

    name: str
    fn: Callable
    args: tuple = ()
    weight: float = 1.0

    @property
    def id(self) -> str:
        fn = f"{self.fn.__module__}.{self.fn.__qualname__}"
        return f"{_slug(self.name, 48)}_{digest((self.name, fn, self.args))}"

    def cost(self) -> float:
        return self.weight

    def done(self, out: str) -> bool:
        path = os.path.join(out, self.id, CODE_FILE)
        if not os.path.exists(os.path.join(out, self.id, RESULT_FILE)) or not os.path.exists(path):
            return False
        with open(path) as f:
            return f.read() == code_digest()

    def execute(self, tmp: str) -> Any:
        result = json.loads(json.dumps(self.fn(*self.args), default=_canonical))
        with open(os.path.join(tmp, RESULT_FILE), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(tmp, CODE_FILE), "w") as f:
            f.write(code_digest())
        return result

    def read(self, out: str) -> Any:
        with open(os.path.join(out, self.id, RESULT_FILE)) as f:
            return json.load(f)


# -- the summary row ---------------------------------------------------------------------------------------

# column: (Arrow type, meaning)
COLUMNS = {
    "point": ("string", "the point's directory under OUT"),
    "regime": ("string", "the regime's name (null: a grid of flags)"),
    "label": ("string", "a name the caller gave the point (`dualjax sim paper`'s runs)"),
    "policy": ("string", "policy name, or module:Class"),
    "workload": ("string", "workload"), "cluster": ("string", "PpDd"), "hardware": ("string", "hardware profile"),
    "model": ("string", "model preset"),
    "snic_mbps": ("float64", "storage read rate per node, MB/s (null: the profile's)"),
    "seed": ("int64", "workload seed"), "agents": ("int64", "agents (null: the preset's)"),
    "turns": ("int64", "turns per agent (null: the preset's)"),
    "aps": ("float64", "online arrival rate, agents/s (null: offline)"),
    "requests": ("int64", "requests completed"),
    "jct_s": ("float64", "job completion time, s"), "tokens_per_s": ("float64", "generated tokens per second"),
    "ttft_p50_s": ("float64", "time to first token, median, s"), "ttft_p99_s": ("float64", "TTFT, 99th percentile, s"),
    "tpot_p50_s": ("float64", "time per output token, median, s"),
    "snic_max_over_avg": ("float64", "storage NICs' max / avg bytes read (steady windows; 1 is even)"),
    "hit_rate": ("float64", "prompt tokens whose KV was read from storage / prompt tokens (report.json's hit_rate: "
                            "a hit the plan recomputed is not counted)"),
    "recomputed_tokens": ("int64", "hit tokens recomputed instead of loaded"),
    "de_tokens": ("int64", "hit tokens read on the decode side and relayed"),
    "slo_attained": ("float64", "fraction of requests within the TTFT and TPOT SLO"),
    "wall_s": ("float64", "wall time of the simulation, s"),
    "group": ("string", "the regime the point's policy is ranked in: every setting but policy and seed"),
    "jct_vs_best": ("float64", "the policy's mean JCT over the group's seeds / the best policy's (1: best)"),
    "best": ("bool_", "this point's policy has the lowest mean JCT of its group"),
}


def row(point: Point, report: dict, wall: float) -> dict:
    """A point's summary row (without its group ranking, `rank`)."""
    t = report["ttft_s"]
    return {**point.settings(), "requests": report["requests"], "jct_s": report["jct_s"],
            "tokens_per_s": report["tokens_per_s"], "ttft_p50_s": t["p50"], "ttft_p99_s": t["p99"],
            "tpot_p50_s": report["tpot_s"]["p50"], "snic_max_over_avg": report["snic_max_over_avg"],
            "hit_rate": report["hit_rate"], "recomputed_tokens": report["recomputed_tokens"],
            "de_tokens": report["de_tokens"], "slo_attained": report["slo"]["attained"], "wall_s": wall}


def group_of(r: dict) -> str:
    """The regime a row's policy competes in: its regime (or cluster, hardware, rate) and workload, with the
    agents, turns, model and arrival rate where they differ from the regime's."""
    where = r["regime"] or f"{r['cluster']} {r['hardware']} {_rate(r['snic_mbps'])}"
    extra = [f"{k} {r[k]}" for k in ("agents", "turns", "aps") if r[k] is not None]
    model = [] if r["regime"] else [r["model"]]
    return " / ".join([where, r["workload"], *model, *extra])


def rank(rows: list[dict]) -> list[dict]:
    """Rows with `group`, `jct_vs_best` and `best` (mean JCT over seeds per policy and group)."""
    means: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        means.setdefault(group_of(r), {}).setdefault(r["policy"], []).append(r["jct_s"])
    best = {g: min(sum(v) / len(v) for v in pol.values()) for g, pol in means.items()}
    out = []
    for r in rows:
        g = group_of(r)
        jct = means[g][r["policy"]]
        rel = (sum(jct) / len(jct)) / best[g] if best[g] else 1.0
        out.append({**r, "group": g, "jct_vs_best": rel, "best": rel == 1.0})
    return out


def regimes_table(rows: list[dict]) -> list[dict]:
    """One entry per group (first-seen order): each policy's mean JCT and JCT relative to the best, the best
    policy (`best`; a tie goes to the first name) and every policy tied with it (`tied`)."""
    groups: dict[str, dict] = {}
    for r in rank(rows):
        g = groups.setdefault(r["group"], {"group": r["group"], "jct_s": {}, "relative": {}})
        g["relative"][r["policy"]] = r["jct_vs_best"]
        g["jct_s"].setdefault(r["policy"], []).append(r["jct_s"])
    for g in groups.values():
        g["jct_s"] = {p: sum(v) / len(v) for p, v in g["jct_s"].items()}
        g["tied"] = sorted(p for p, v in g["relative"].items() if v == 1.0)
        g["best"] = g["tied"][0]
    return list(groups.values())


def write_summary(path: str, rows: list[dict]) -> None:
    """The ranked rows (`rank`) as a Parquet table with `COLUMNS`' types and meanings."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    ranked = rank(rows)
    fields = [pa.field(k, getattr(pa, typ)(), metadata={"meaning": meaning}) for k, (typ, meaning) in COLUMNS.items()]
    schema = pa.schema(fields, metadata={"dualjax.kind": "sweep"})
    table = pa.Table.from_pylist([{k: r.get(k) for k in COLUMNS} for r in ranked], schema=schema)
    pq.write_table(table, path, compression="zstd")


def read_summary(path: str) -> list[dict]:
    import pyarrow.parquet as pq
    return pq.read_table(path).to_pylist()


# -- the grid --------------------------------------------------------------------------------------------

def _distinct(name: str, values) -> tuple:
    values = tuple(values)
    if not values:
        raise SweepError(f"{name}: no values")
    keys = [policy_ref(v) if isinstance(v, Policy) else v for v in values]
    dups = [k for k in keys if keys.count(k) > 1]
    if dups:
        raise SweepError(f"{name}: {dups[0]} given twice")
    return values


def grid(policies, workloads=None, clusters=None, snic_mbps=None, seeds=(0,), hardware=None, regimes=None,
         base: SimConfig | None = None, **settings) -> list[Point]:
    """The points of a grid. `policies`: names, `module:Class` references or Policy objects. Without
    `regimes`: every combination of `clusters` x `hardware` x `snic_mbps` (MB/s per node, None: the
    profile's) x `workloads` x `policies` x `seeds`, each axis defaulting to `base`'s value (default
    SimConfig()). With `regimes` (names of `REGIMES`): each regime's hardware, model, cluster and rate x its
    workloads (or `workloads`) x policies x seeds; `clusters`, `hardware`, `snic_mbps` and a model are the
    regime's, so giving them too is an error. `settings`: SimConfig fields every point shares (agents, turns,
    aps, scheduler...). Raises SweepError (and ConfigError for a bad setting) before anything runs."""
    base = dataclasses.replace(base or SimConfig(), **settings)
    policies = _distinct("policies", policies)
    seeds = _distinct("seeds", seeds)
    for s in seeds:
        if not isinstance(s, int) or s < 0:
            raise SweepError(f"seeds: {s!r} is not an integer >= 0")
    if workloads is not None:
        workloads = _distinct("workloads", workloads)
    points = []
    if regimes is not None:
        regimes = _distinct("regimes", REGIMES if list(regimes) == ["all"] else regimes)
        fixed = [name for name, v in (("clusters", clusters), ("snic_mbps", snic_mbps), ("hardware", hardware),
                                      ("model", settings.get("model"))) if v is not None]
        if fixed:
            raise SweepError(f"{', '.join(fixed)}: a regime sets its own (docs/sweep.md); give regimes or these, "
                             f"not both")
        for name in regimes:
            if name not in REGIMES:
                raise SweepError(f"unknown regime {name!r}; regimes: {', '.join(REGIMES)}, all")
            reg = REGIMES[name]
            cfg = dataclasses.replace(base, hardware=reg.hardware, model=reg.model,
                                      cluster=ClusterSpec.parse(reg.cluster), snic_mbps=reg.snic_mbps)
            points += _product(cfg, workloads or reg.available_workloads(), policies, seeds, regime=name)
        return points
    clusters = _distinct("clusters", clusters or [base.cluster.name])
    rates = _distinct("snic_mbps", [base.snic_mbps] if snic_mbps is None else snic_mbps)
    for r in rates:
        if r is not None and not r > 0:
            raise SweepError(f"snic_mbps: {r} is not a rate > 0 (MB/s per node)")
    hardware = _distinct("hardware", hardware or [base.hardware])
    for cluster in clusters:
        for hw in hardware:
            for rate in rates:
                cfg = dataclasses.replace(base, cluster=ClusterSpec.parse(cluster) if isinstance(cluster, str)
                                          else cluster, hardware=hw, snic_mbps=rate)
                points += _product(cfg, workloads or [base.workload], policies, seeds)
    return points


def _product(cfg: SimConfig, workloads, policies, seeds, regime: str | None = None) -> list[Point]:
    out = []
    for w in workloads:
        for p in policies:
            for s in seeds:
                name = p if isinstance(p, str) else cfg.policy
                out.append(Point(dataclasses.replace(cfg, workload=w, policy=name, workload_seed=s), regime=regime,
                                 policy=None if isinstance(p, str) else p))
    return out


def check(points: list[Point]) -> None:
    """Everything a point needs resolves, before any runs: its policy (made once), hardware profile, model and
    workload. Raises the project's bad-input errors (one line each)."""
    seen: set = set()
    for p in points:
        c = p.config
        for key, test in ((("policy", p.policy_name), lambda: p.policy if p.policy is not None else _made(c.policy)),
                          (("hardware", p.hardware_name, c.model), lambda: _hardware_fits(p)),
                          (("workload", c.workload, c.agents, c.turns), lambda: _workload(c))):
            if key not in seen:
                seen.add(key)
                test()
    ids = [p.id for p in points]
    if dup := next((i for i in ids if ids.count(i) > 1), None):
        raise SweepError(f"point {dup} is in the grid twice")


def _made(policy: str) -> Policy:
    try:
        return get_policy(policy)
    except TypeError as e:  # a class whose constructor needs arguments
        raise SweepError(f"policy {policy!r} cannot be made without arguments ({e}): give it defaults") from None


def _hardware_fits(p: Point) -> None:
    hw = p.hardware or get_hardware(p.config.hardware)
    model_cost(p.config.model)
    if hw.model is not None and hw.model != p.config.model:
        raise SweepError(f"hardware profile {hw.name!r} was calibrated with model {hw.model!r}, not "
                         f"{p.config.model!r}")


def _workload(c: SimConfig) -> None:
    if _is_preset_name(c.workload):
        get_workload(c.workload, agents=c.agents, turns=c.turns)
    else:
        from dualjax.sim import workload_lengths
        workload_lengths(c)


# -- running tasks ---------------------------------------------------------------------------------------

def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _context():
    """'forkserver' where there is one (workers fork from a server that imported the simulator once),
    else 'spawn': never a plain fork of a process that may hold threads (a notebook, an MPI rank)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["dualjax.sim", "dualjax.sim.sweep"])
        return ctx
    return multiprocessing.get_context("spawn")


def _execute(task, out: str) -> tuple[Any, float, str | None]:
    """In a worker: run `task` into a private directory and rename it to OUT/<id> (whole or not at all).
    (result, wall s, traceback text or None)."""
    t0 = time.perf_counter()
    tmp = os.path.join(out, PARTIAL, f"{task.id}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        result = task.execute(tmp)
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        return None, time.perf_counter() - t0, traceback.format_exc()
    final = os.path.join(out, task.id)
    if os.path.isdir(final) and not task.done(out):  # another code's result (`code_digest`): replaced
        shutil.rmtree(final, ignore_errors=True)
    try:
        os.replace(tmp, final)
    except OSError:  # another rank finished it first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return result, time.perf_counter() - t0, None


@dataclasses.dataclass
class Outcome:
    """What `run_tasks` did: each task's result by id (rows for points), which ran, which were read back,
    which were skipped (`admit`) and why, and which failed (their traceback's file)."""

    results: dict[str, Any] = dataclasses.field(default_factory=dict)
    ran: list[str] = dataclasses.field(default_factory=list)
    resumed: list[str] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    failed: dict[str, str] = dataclasses.field(default_factory=dict)
    wall_s: float = 0.0


def run_tasks(tasks: list, out: str, jobs: int | None = None, progress: bool = True, admit=None, on_done=None,
              desc: str = "points") -> Outcome:
    """Run `tasks` (Points and Calls, in the order given) with `jobs` processes (default: every core; 1: in
    this process), skipping those whose outputs exist under `out` (read back instead). `admit(task)` is
    asked just before a task starts: a reason string skips it. `on_done(task, result, wall, resumed)` is
    called here as each ends. A task that raises leaves its traceback in OUT/failed/<id>.txt and the rest
    go on. Shows a progress bar over the tasks unless `progress` is False."""
    from tqdm import tqdm
    jobs = jobs or default_jobs()
    os.makedirs(out, exist_ok=True)
    t0 = time.perf_counter()
    outcome = Outcome()
    pending = []
    for t in tasks:
        if t.done(out):
            outcome.results[t.id] = t.read(out)
            outcome.resumed.append(t.id)
            if on_done:
                on_done(t, outcome.results[t.id], None, True)
        else:
            pending.append(t)
    bar = tqdm(total=len(tasks), initial=len(outcome.resumed), desc=desc, unit="pt", disable=not progress,
               file=sys.stderr, dynamic_ncols=True)

    def finished(task, result, wall, error) -> None:
        if error is not None:
            path = os.path.join(out, FAILED, f"{task.id}.txt")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(error)
            outcome.failed[task.id] = path
        else:
            outcome.results[task.id] = result
            outcome.ran.append(task.id)
            with contextlib.suppress(FileNotFoundError):  # an earlier sweep's failure of this point
                os.remove(os.path.join(out, FAILED, f"{task.id}.txt"))
            if on_done:
                on_done(task, result, wall, False)
        bar.update(1)

    def admitted(task) -> bool:
        why = admit(task) if admit else None
        if why:
            outcome.skipped[task.id] = why
            bar.update(1)
        return not why

    try:
        if jobs == 1 or len(pending) <= 1:
            for task in pending:
                if admitted(task):
                    finished(task, *_execute(task, out))
        else:
            with cf.ProcessPoolExecutor(max_workers=min(jobs, len(pending)), mp_context=_context()) as pool:
                queue, running = list(pending), {}
                while queue or running:
                    while queue and len(running) < jobs:
                        task = queue.pop(0)
                        if admitted(task):
                            running[pool.submit(_execute, task, out)] = task
                    if not running:
                        continue
                    done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                    for fut in done:
                        finished(running.pop(fut), *fut.result())
    finally:
        bar.close()
        try:  # empty unless a process was killed mid-point (or another rank is still writing): then left
            os.rmdir(os.path.join(out, PARTIAL))
        except OSError:
            pass
    outcome.wall_s = time.perf_counter() - t0
    return outcome



def longest_first(tasks: list) -> list:
    """`tasks` by cost, the costliest first (ties keep their order): no long point starts last."""
    return sorted(tasks, key=lambda t: -t.cost())


def share(tasks: list, rank: int, size: int) -> list:
    """Rank `rank`'s share of `tasks` among `size` ranks, costliest first: each task, costliest first, to the
    rank with the least cost so far (the same answer on every rank, with no messages)."""
    load = [0.0] * size
    mine = []
    for t in longest_first(tasks):
        r = min(range(size), key=lambda k: (load[k], k))
        load[r] += t.cost()
        if r == rank:
            mine.append(t)
    return mine


# -- a sweep ---------------------------------------------------------------------------------------------

def sweep(points: list[Point], out: str, jobs: int | None = None, progress: bool = True, plot: str | None = None,
          log=print) -> dict:
    """Run a grid's points (`grid`) under `out` and write `OUT/summary.parquet` (and `plot`, a PNG): returns
    {"rows" (ranked, point order), "regimes" (`regimes_table`), "ran", "resumed", "failed", "wall_s"}."""
    check(points)
    outcome = run_tasks(longest_first(points), out, jobs, progress)
    return finish(points, outcome, out, plot, log)


def finish(points: list[Point], outcome: Outcome, out: str, plot: str | None = None, log=print) -> dict:
    """The summary table (and figure) of a sweep's points from their rows in `outcome`."""
    rows = [outcome.results[p.id] for p in points if p.id in outcome.results]
    if rows:
        write_summary(os.path.join(out, SUMMARY), rows)
    table = regimes_table(rows)
    if plot and rows:
        from dualjax.plots import plot_sweep
        plot_sweep(plot, table)
    if outcome.failed:
        log(f"{len(outcome.failed)} point(s) failed; tracebacks: " + ", ".join(outcome.failed.values()))
    return {"rows": rank(rows), "regimes": table, "ran": len(outcome.ran), "resumed": len(outcome.resumed),
            "failed": outcome.failed, "wall_s": outcome.wall_s, "summary": os.path.join(out, SUMMARY)}


def text_table(rows: list[dict]) -> str:
    """The ranked rows as a fixed-width table, a group per block, best policy marked `*` (`loaded`: the
    hit rate, prompt tokens read from storage)."""
    head = (f"{'policy':32s} {'seed':>4s} {'JCT s':>10s} {'vs best':>8s} {'TTFT p50':>9s} {'p99':>9s} "
            f"{'SNIC max/avg':>12s} {'recomputed':>11s} {'loaded':>6s} {'wall s':>7s}")
    lines, group = [], None
    for r in sorted(rank(rows), key=lambda r: (r["group"], r["jct_vs_best"], r["policy"], r["seed"])):
        if r["group"] != group:
            group = r["group"]
            lines += ["", group, head]
        snic = r["snic_max_over_avg"]
        lines.append(f"{('*' if r['best'] else ' ') + r['policy'][:31]:32s} {r['seed']:4d} {r['jct_s']:10.1f} "
                     f"{r['jct_vs_best']:7.3f}x {r['ttft_p50_s']:9.2f} {r['ttft_p99_s']:9.2f} "
                     f"{'—' if snic is None else format(snic, '.2f'):>12s} {r['recomputed_tokens']:11,d} "
                     f"{r['hit_rate']:6.1%} {r['wall_s']:7.1f}")
    return "\n".join(lines[1:])


__all__ = ["REGIMES", "Regime", "Point", "Call", "SweepError", "grid", "check", "sweep", "run_tasks", "share",
           "finish", "rank", "regimes_table", "write_summary", "read_summary", "text_table", "default_jobs"]
