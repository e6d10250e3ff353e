"""The paper's evaluation, simulated (`dualjax sim paper`): its points, the fitted ones beside the
paper's figures and the rest as predictions, in one JSON object, a markdown table and a figure.

Points (`Scale`; the full one: 2P4D, paper-64k, DeepSeek-V3.2 on `paper-h800` as fitted):

* `ablation` at 1,024 and 2,048 agents: basic, layerwise, dual-path, dualpath (`sim.ablation`);
* `offline` JCT of dualpath, basic and oracle at 512, 2,048 and 4,096 agents;
* `snic_max_over_avg` of round-robin reads against DualPath's (2,048 agents);
* `online` TTFT / TTST / TPOT of DualPath at 0.4 APS over the paper's steady-state window;
* `capacity_aps` of Basic and DualPath within the SLO (`search.find_capacity`), under each reading of its
  stop rule (`capacity_aps_by_reading`: mean TTFT, and 90 % of requests within both limits);
* `large`: 48P96D x 49,152 agents offline (DualPath) and its wall time, run after the other points with
  none beside it (skip: `large=False`);
* `mechanisms`: Basic's loading discipline and layerwise's layers held, each both ways (2,048 agents);
* `sensitivity` (optional): the headline, DualPath over Basic at 2,048 agents, with each assumed input
  at x0.5 and x1.5 of its value (the fitted inputs held).

The points run through the sweep's pool (`dualjax.sim.sweep.run_tasks`): on every core, the longest
first, each run's outputs under `out/<point-id>/` as `dualjax sim --out` writes them (the online trial's
and the capacity searches' results as result.json), so that a second call with the same `out` reads back
what the first finished. With `max_wall_s`, they start in order of importance instead, and a point is
skipped, and listed under `skipped`, when the wall time spent so far and its own predicted wall (its
requests at the seconds per request measured so far) would pass `max_wall_s`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import time

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.sim import ablation
from dualjax.sim.ablation import summary
from dualjax.sim.profiles import Hardware, oracle_of, read_fit
from dualjax.sim.resources import SimError
from dualjax.sim.search import agent_lifetime, find_capacity, steady_state
from dualjax.sim.sweep import Call, Point, default_jobs, run_tasks

# The paper's figures a report sets beside its own (docs/paper.md §11, §12; the JCTs: a reading of
# its ablation figure). `fitted`: the ones `dualjax sim fit` matched; every other is a prediction.
PAPER = {"ablation_2048": {"layerwise": 8750.0, "dualpath": 5450.0}, "fitted": ["ablation_2048", "fig3"],
         "fig3": {"5": 2.55, "10": 2.95}, "dualpath_over_basic_max": 1.87, "dualpath_within_oracle": 0.10,
         "capacity_ratio": [1.67, 2.25], "slo": {"ttft_s": 4.0, "tpot_s": 0.050}}
# the paper's five steps in its order (`dualjax/sim/ablation.py`), and the step without scheduling that keeps the
# read-path rule (`dual-path-queue`) beside the paper's (`dual-path`: no rule either)
ABLATION_STEPS = (*ablation.PAPER_STEPS, "dual-path-queue")
SLO_READINGS = ("mean", "attainment")  # the capacity under each reading of the stop rule (`search.within_slo`)
HORIZON_S = 5600.0  # at most, seconds of arrivals an online trial simulates (`search.steady_state`)
OFFLINE = ("dualpath", "basic", "oracle")


def _scaled(field: str, how=lambda value, f: value * f):
    return lambda hw, f: dataclasses.replace(hw, **{field: how(getattr(hw, field), f)})


# Assumed inputs (docs/simulator.md) and how `sensitivity` scales each by f = 0.5 and 1.5: the value x f,
# the EP groups' GPUs rounded down, each DeepEP latency (the rule of one dispatch and one combine per MoE
# layer a step waits for is the assumption, the figures are not), and the storage queue-depth curve,
# assumed absent (0), at 1 and 3 (half rate at that many reads outstanding).
ASSUMED = {"hbm_reserve_bytes": _scaled("hbm_reserve_bytes"),
           "decode_step_overhead_s": _scaled("decode_step_overhead_s"),
           "ep_gpus": _scaled("ep_gpus", lambda v, f: int(v * f)),
           "ep_latency_us": _scaled("ep_latency_us", lambda v, f: tuple((ep, d * f, c * f) for ep, d, c in v)),
           "dram_bytes_per_s": _scaled("dram_bytes_per_s"),
           "snic_depth_half": _scaled("snic_depth_half", lambda v, f: 2.0 * f)}
MECHANISMS = {"basic, 1 batch ahead (hbm)": ("basic", dict(basic_ahead=1)),
              "basic, 1 batch ahead (host)": ("basic", dict(basic_ahead=1, basic_lands="host")),
              "basic, 4 batches ahead (host)": ("basic", dict(basic_ahead=4, basic_lands="host")),
              "layerwise, 1 layer held": ("layerwise", dict(layerwise_layers=1))}


@dataclasses.dataclass(frozen=True)
class Scale:
    """Where the points run: the paper's (default) or a tiny one (`QUICK`, for tests)."""

    cluster: str = "2p4d"
    ablation: tuple[int, ...] = (1024, 2048)
    offline: tuple[int, ...] = (512, 2048, 4096)
    headline: int = 2048
    turns: int | None = None
    online_aps: float = 0.4
    capacity_start_aps: float = 0.25
    capacity_steps: int = 5
    large_cluster: str = "48p96d"
    large_agents: int = 49152


QUICK = Scale(cluster="2p2d", ablation=(8, 16), offline=(8, 16, 32), headline=16, turns=4, online_aps=0.05,
              capacity_start_aps=1.0, capacity_steps=1, large_cluster="4p4d", large_agents=32)


class Paper:
    """The points in order of importance, run through the sweep's pool (`sweep.run_tasks`: every core,
    resumable under `out`) within the wall bound; each run's summary under `details`, by name."""

    def __init__(self, hw: Hardware, scale: Scale = Scale(), max_wall_s: float = float("inf"), log=print,
                 workload: str = "paper-64k", model: str = "deepseek-v3.2"):
        self.hw, self.scale, self.max_wall_s, self.log = hw, scale, max_wall_s, log
        self.base = SimConfig(ClusterSpec.parse(scale.cluster), workload=workload, model=model, turns=scale.turns)
        self.t0 = time.time()
        self.details: dict[str, dict] = {}
        self.skipped: dict[str, str] = {}
        self.requests = self.walls = 0.0  # of the offline runs so far: their seconds per request
        self.tasks: list = []
        self.alone: list = []  # points run after the rest, one at a time: their wall is a lone `dualjax sim`'s
        self.names: dict[str, tuple[str, float]] = {}  # task id: (name, agents it simulates, about)

    def fits(self, name: str, requests: float) -> bool:
        """Whether a point of about `requests` requests still fits `max_wall_s` (else it is skipped)."""
        per = self.walls / self.requests if self.requests else 0.0
        predicted = 1.5 * per * requests
        spent = time.time() - self.t0
        if spent + predicted <= self.max_wall_s:
            return True
        self.skipped[name] = f"predicted {predicted:.0f} s after {spent:.0f} s: past --max-wall-s {self.max_wall_s:g}"
        self.log(f"  {name}: skipped ({self.skipped[name]})")
        return False

    def requests_per_agent(self) -> float:
        runs = [d for d in self.details.values() if "agents" in d and "requests" in d]
        return sum(d["requests"] for d in runs) / sum(d["agents"] for d in runs) if runs else 100.0

    def run(self, step: str, agents: int, label: str | None = None, hw: Hardware | None = None,
            cluster: str | None = None, alone: bool = False, **changes) -> None:
        """An offline run (an ablation step, with `changes` to the config) to make, once per name (`alone`:
        after the others, with no other point beside it)."""
        name = label or f"{step}@{agents}"
        if name in self.details:
            return
        cfg = dataclasses.replace(self.base, agents=agents, **changes)
        if cluster:
            cfg = dataclasses.replace(cfg, cluster=ClusterSpec.parse(cluster))
        cfg, hw = step_config(cfg, step, hw or self.hw)
        point = Point(cfg, label=name, hardware=hw)
        (self.alone if alone else self.tasks).append(point)
        self.names[point.id] = (name, agents)
        self.details[name] = {"step": step, "agents": agents, "cluster": cfg.cluster.name, **changes}  # + its run

    def call(self, name: str, fn, args: tuple, agents: float) -> None:
        """An online trial or capacity search (`fn(*args)`, simulating about `agents` agents) to make."""
        task = Call(name, fn, args, weight=agents)
        self.tasks.append(task)
        self.names[task.id] = (name, agents)

    def execute(self, out: str, jobs: int | None = None, progress: bool = False) -> None:
        """Run every task (resumable under `out`); the longest first unless a wall bound asks for the order
        of importance; then the `alone` ones on one process."""
        tasks = self.tasks if math.isfinite(self.max_wall_s) else sorted(self.tasks, key=lambda t: -t.cost())

        def admit(task) -> str | None:
            name, agents = self.names[task.id]
            return None if self.fits(name, agents * self.requests_per_agent()) else self.skipped[name]

        self.log(f"{len(tasks)} points on {jobs or default_jobs()} process(es), then {len(self.alone)} alone, "
                 f"outputs under {out}")
        def done(*args) -> None:
            self._done(out, *args)

        outcome = run_tasks(tasks, out, jobs, progress, admit=admit, on_done=done, desc="sim paper")
        if self.alone:
            outcome.failed |= run_tasks(self.alone, out, 1, progress, admit=admit, on_done=done,
                                        desc="sim paper, alone").failed
        every = self.tasks + self.alone
        for task in every:  # a skipped or failed run has no figures
            name = self.names[task.id][0]
            if isinstance(task, Point) and "jct_s" not in self.details.get(name, {}):
                self.details.pop(name, None)
        if outcome.failed:
            raise SimError(f"{len(outcome.failed)} point(s) failed; tracebacks: " + ", ".join(outcome.failed.values()))
        order = [self.names[t.id][0] for t in every]
        self.details = {n: self.details[n] for n in order if n in self.details}

    def _done(self, out: str, task, result, wall, resumed: bool) -> None:
        name = self.names[task.id][0]
        if isinstance(task, Call):
            self.details[name] = result
            self.log(f"  {name:34s} {_call_line(result)}" + ("  (read back)" if resumed else ""))
            return
        with open(os.path.join(out, task.id, "report.json")) as f:
            r = json.load(f)
        wall = result["wall_s"]
        self.requests += r["requests"]
        self.walls += wall
        self.details[name] |= {**summary(r), "run_wall_s": wall}
        u = r["sim"]
        self.log(f"  {name:34s} JCT {r['jct_s']:9.1f} s  rows/pass {u['prefill']['rows_per_pass'] or 0:5.2f}  "
                 f"PE SNIC busy {u['pe_snic_busy_mean']:4.0%}  TPOT p50 {(r['tpot_s']['p50'] or 0) * 1e3:5.1f} ms  "
                 f"({u['events'] / r['requests']:.2f} events/request, {wall:.0f} s)" + ("  (read back)" if resumed
                                                                                         else ""))

    def jct(self, name: str) -> float | None:
        return self.details.get(name, {}).get("jct_s")

    def online(self) -> dict | None:
        t = self.details.get("online")
        if t is None:
            return None
        mean = (lambda k: t[k] and t[k]["mean"])  # noqa: E731
        return {"aps": self.scale.online_aps, "window_s": t["window_s"], "stationary": t["stationary"],
                "ttft_s": mean("ttft_s"), "ttst_s": mean("ttst_s"), "tpot_s": mean("tpot_s"),
                "slo_attained": t["attained"]}

    def capacity(self, policy: str, reading: str = SLO_READINGS[0]) -> float | None:
        c = self.details.get(f"capacity {policy}")
        return None if c is None else c.get("by_reading", {}).get(reading, c["capacity_aps"])


def step_config(cfg: SimConfig, step: str, hw: Hardware) -> tuple[SimConfig, Hardware]:
    """The config and hardware of an ablation step on `cfg` (as `ablation.step_report` runs it)."""
    if hasattr(ablation, "step_config"):
        return ablation.step_config(cfg, step, hw)
    changes = dict(ablation.STEPS)[step]
    return dataclasses.replace(cfg, layerwise=None, **changes), oracle_of(hw) if step == "oracle" else hw


def online_trial(cfg: SimConfig, aps: float, hw: Hardware) -> dict:
    """DualPath at `aps` over the paper's steady-state window (`search.steady_state`; in a worker)."""
    return steady_state(cfg, aps, agent_lifetime(cfg, "dualpath", hw), "dualpath", hw)


def capacity_search(cfg: SimConfig, start_aps: float, steps: int, policy: str, hw: Hardware) -> dict:
    """`search.find_capacity` of `policy` under each of `SLO_READINGS` (sharing their trials; in a worker: its
    trials are not printed, its result lists them): the first reading's result, and `by_reading`."""
    cache: dict = {}
    runs = {r: find_capacity(cfg, start_aps=start_aps, steps=steps, policy=policy, hardware=hw, log=lambda *a: None,
                             reading=r, cache=cache) for r in SLO_READINGS}
    return {**runs[SLO_READINGS[0]], "by_reading": {r: c["capacity_aps"] for r, c in runs.items()}}


def _call_line(r: dict) -> str:
    if "capacity_aps" in r:
        return f"capacity {r['capacity_aps']:.3f} APS ({len(r.get('trials', []))} trials)"
    return f"TTFT mean {_f(r['ttft_s'] and r['ttft_s']['mean'], '.2f')} s at {r['aps']:g} APS"


def reproduce(hw: Hardware, fit_file: str | None, scale: Scale = Scale(), large: bool = True,
              sensitivity: bool = False, max_wall_s: float = float("inf"), log=print, out: str | None = None,
              jobs: int | None = None, progress: bool = False) -> dict:
    """The report's dictionary (`sim paper`'s JSON) less its table and figure paths. Every point runs through
    the sweep's pool on `jobs` processes (default: every core), its outputs under `out` (default: a
    temporary directory, removed after), where a later call with the same `out` reads it back."""
    p = Paper(hw, scale, max_wall_s, log)
    s, head = scale, scale.headline
    for agents in sorted(s.ablation, key=lambda a: a != head):  # the fit points first
        for st in ABLATION_STEPS:
            p.run(st, agents)
    for a in s.offline:
        for pol in OFFLINE:
            p.run(pol, a)
    for pol in ("round-robin", "dualpath"):
        p.run(pol, head)
    p.call("online", online_trial, (p.base, s.online_aps, hw), s.online_aps * HORIZON_S)
    p.run("basic", head)
    p.run("layerwise", head)
    for label, (step, changes) in MECHANISMS.items():
        p.run(step, head, label=label, **changes)
    for pol in ("basic", "dualpath"):
        p.call(f"capacity {pol}", capacity_search, (p.base, s.capacity_start_aps, s.capacity_steps, pol, hw),
               10 * s.capacity_start_aps * HORIZON_S)
    if large:
        p.run("dualpath", s.large_agents, label="large", cluster=s.large_cluster, alone=True)
    if sensitivity:
        for name, scaled in ASSUMED.items():
            for f in (0.5, 1.5):
                for st in ("basic", "dualpath"):
                    p.run(st, head, label=f"{name} x{f}: {st}", hw=scaled(hw, f))
    if out is None:
        with tempfile.TemporaryDirectory(prefix="dualjax-paper-") as tmp:
            p.execute(tmp, jobs, progress)
    else:
        p.execute(out, jobs, progress)
    ablation_jct = {agents: {st: p.jct(f"{st}@{agents}") for st in ABLATION_STEPS}
                    for agents in sorted(s.ablation, key=lambda a: a != head)}
    offline = {a: {pol: p.jct(f"{pol}@{a}") for pol in OFFLINE} for a in s.offline}
    snic = {pol: p.details.get(f"{pol}@{head}", {}).get("snic_max_over_avg") for pol in ("round-robin", "dualpath")}
    mechanisms = {"basic (default: 0 batches ahead, hbm)": p.details.get(f"basic@{head}"),
                  "layerwise (default: 2 layers held)": p.details.get(f"layerwise@{head}")}
    mechanisms |= {label: p.details.get(label) for label in MECHANISMS}
    out_ = {"ablation": ablation_jct, "offline": offline, "capacity_aps": {pol: p.capacity(pol) for pol in
                                                                           ("basic", "dualpath")},
            "capacity_aps_by_reading": {r: {pol: p.capacity(pol, r) for pol in ("basic", "dualpath")}
                                        for r in SLO_READINGS},
            "attention_max_over_avg": {st: (p.details.get(f"{st}@{head}") or {}).get("prefill", {})
                                       .get("attention_max_over_avg") for st in ("dual-path", "dualpath")},
            "snic_max_over_avg": snic, "online": p.online(), "large": None,
            "mechanisms": {k: _mechanism(d) for k, d in mechanisms.items()},
            "fit": read_fit(fit_file) if fit_file else None, "paper": PAPER}
    if large and (g := p.details.get("large")):
        out_["large"] = {"cluster": s.large_cluster, "agents": s.large_agents, "jct_s": g["jct_s"],
                         "wall_s": g["run_wall_s"]}
    if sensitivity:
        out_["sensitivity"] = _sensitivity(p, hw)
    out_ |= {"details": p.details, "skipped": p.skipped, "wall_s": time.time() - p.t0,
             "scale": dataclasses.asdict(scale)}
    return out_


def _mechanism(d: dict | None) -> dict | None:
    if d is None:
        return None
    return {"jct_s": d["jct_s"], "rows_per_pass": d["prefill"]["rows_per_pass"],
            "pe_snic_busy": d["sim"]["pe_snic_busy_mean"], "pe_compute": d["utilisation"]["pe_compute"],
            "load_wait_s": d["prefill"]["load_wait_s"]["mean"]}


def _sensitivity(p: Paper, hw: Hardware) -> dict:
    """DualPath's and Basic's JCT and their ratio with each assumed input scaled (the fitted ones held)."""
    out = {}
    for name, scaled in ASSUMED.items():
        out[name] = {}
        for f in (0.5, 1.5):
            jcts = {st: p.jct(f"{name} x{f}: {st}") for st in ("basic", "dualpath")}
            value = f if name == "ep_latency_us" else getattr(scaled(hw, f), name)
            out[name][f"x{f}"] = {**jcts, "speedup": speedup(jcts["basic"], jcts["dualpath"]), "value": value}
    return out


def speedup(a: float | None, b: float | None) -> float | None:
    """a / b; None where either is missing or b is 0 (e.g. a capacity the search found none of)."""
    return None if a is None or not b else a / b


def _f(x, fmt: str = ",.0f") -> str:
    return "—" if x is None else format(x, fmt)


def markdown(r: dict) -> str:
    """The report (as its JSON reads: string keys) as markdown tables: the fit beside its targets, then
    every point (predictions)."""
    out = []
    fit = r.get("fit")
    if fit:
        a, t = fit["achieved"], fit["targets"]
        out += ["**Fitted** (`dualjax sim fit`, " + ", ".join(f"{k} = {v:.4g}" for k, v in fit["fitted"].items()) + ")",
                "", "| figure | paper | simulated |", "|---|---|---|",
                f"| + layerwise JCT, 2P4D x 2,048 | {t['layerwise_jct_s']:,.0f} s | {a['layerwise_jct_s']:,.0f} s |",
                f"| DualPath JCT, 2P4D x 2,048 | {t['dualpath_jct_s']:,.0f} s | {a['dualpath_jct_s']:,.0f} s |"]
        out += [f"| Fig. 3 prefill throughput, batch {b} / batch 1 | {v:.2f}x | {a['fig3'][b]:.2f}x |"
                for b, v in t["fig3"].items()]
        out.append("")
    abl = r["ablation"]
    sizes = sorted(abl, key=int)
    head = str(max(sizes, key=int))
    out += ["**Ablation** (JCT s; the paper's reading where it has one)", "",
            "| step | " + " | ".join(f"{a} agents" for a in sizes) + f" | vs Basic ({head}) | paper ({head}) |",
            "|---|" + "---|" * (len(sizes) + 2)]
    base = abl[head].get("basic")
    for step in ABLATION_STEPS:
        paper = PAPER["ablation_2048"].get(step) if head == "2048" else None
        vs = _f(speedup(abl[head].get(step), base) and abl[head][step] / base - 1, "+.1%")
        out.append(f"| {step} | " + " | ".join(_f(abl[a].get(step)) for a in sizes)
                   + f" | {vs} | {_f(paper) + ' (fitted)' if paper else '—'} |")
    dual, oracle = abl[head].get("dualpath"), abl[head].get("oracle")
    out += ["", f"DualPath over Basic at {head} agents: {_f(speedup(base, dual), '.2f')}x (paper: up to "
            f"{PAPER['dualpath_over_basic_max']}x); DualPath over Oracle: {_f(speedup(dual, oracle), '.2f')}x "
            "(paper: within about 10 %).", ""]
    off = r["offline"]
    out += ["**Offline JCT** (s; predictions)", "", "| agents | Basic | DualPath | Oracle | Basic / DualPath | "
            "DualPath / Oracle |", "|---|---|---|---|---|---|"]
    for a in sorted(off, key=int):
        o = off[a]
        out.append(f"| {int(a):,} | {_f(o.get('basic'))} | {_f(o.get('dualpath'))} | {_f(o.get('oracle'))} | "
                   f"{_f(speedup(o.get('basic'), o.get('dualpath')), '.2f')}x | "
                   f"{_f(speedup(o.get('dualpath'), o.get('oracle')), '.2f')}x |")
    cap, snic, on = r["capacity_aps"], r["snic_max_over_avg"], r["online"] or {}
    steady = "steady window" if on.get("stationary") else "never steady: the last window checked"
    out += ["", f"**Online** (predictions; at {on.get('aps', '—')} APS: {steady}, {on.get('window_s')} s)", "",
            "| figure | simulated | paper |", "|---|---|---|",
            f"| capacity, Basic (APS) | {_f(cap.get('basic'), '.3f')} | |",
            f"| capacity, DualPath (APS) | {_f(cap.get('dualpath'), '.3f')} | |",
            f"| capacity, DualPath / Basic | {_f(speedup(cap.get('dualpath'), cap.get('basic')), '.2f')}x | "
            f"{PAPER['capacity_ratio'][0]}x-{PAPER['capacity_ratio'][1]}x (two models) |",
            *(f"| capacity ({reading} reading), Basic / DualPath (APS) | {_f(c.get('basic'), '.3f')} / "
              f"{_f(c.get('dualpath'), '.3f')} | |" for reading, c in (r.get("capacity_aps_by_reading") or {}).items()),
            f"| TTFT at {on.get('aps', '—')} APS (mean, s) | {_f(on.get('ttft_s'), '.2f')} | SLO <= 4 s |",
            f"| TTST at {on.get('aps', '—')} APS (mean, ms) | {_f(on.get('ttst_s') and on['ttst_s'] * 1e3, '.1f')} | |",
            f"| TPOT at {on.get('aps', '—')} APS (mean, ms) | {_f(on.get('tpot_s') and on['tpot_s'] * 1e3, '.1f')} | "
            "SLO <= 50 ms; no penalty |",
            f"| storage-NIC max/avg, round-robin reads | {_f(snic.get('round-robin'), '.2f')} | |",
            f"| storage-NIC max/avg, DualPath | {_f(snic.get('dualpath'), '.2f')} | |"]
    if r.get("large"):
        g = r["large"]
        out += [f"| {g['cluster']} x {g['agents']:,} agents, DualPath JCT (s) | {g['jct_s']:,.0f} | flat against "
                f"2P4D x 2,048 ({_f(abl[head].get('dualpath'))} s) |", f"| its wall time (s) | {g['wall_s']:,.0f} | |"]
    out += ["", f"**Mechanisms, each both ways** ({r['scale']['cluster']} x {head} agents, predictions)", "",
            "| setting | JCT s | rows/pass | PE storage NIC busy | PE compute | wait to load (s) |",
            "|---|---|---|---|---|---|"]
    for k, m in r["mechanisms"].items():
        if m:
            out.append(f"| {k} | {m['jct_s']:,.0f} | {m['rows_per_pass']:.2f} | {m['pe_snic_busy']:.0%} | "
                       f"{m['pe_compute']:.0%} | {_f(m['load_wait_s'], '.2f')} |")
    if r.get("sensitivity"):
        out += ["", "**Sensitivity of the headline to the assumed inputs** (fitted inputs held)", "",
                "| input | value | Basic JCT | DualPath JCT | DualPath / Basic speed-up |", "|---|---|---|---|---|"]
        for name, runs in r["sensitivity"].items():
            for f, v in runs.items():
                out.append(f"| {name} {f} | {v['value']:.4g} | {_f(v['basic'])} | {_f(v['dualpath'])} | "
                           f"{_f(v['speedup'], '.2f')}x |")
    if r.get("skipped"):
        out += ["", "Skipped: " + "; ".join(f"{k} ({v})" for k, v in r["skipped"].items())]
    return "\n".join(out) + "\n"
