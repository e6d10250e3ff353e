"""Run settings: one frozen dataclass per kind of run, the single source of every flag.

Each field is declared once with `setting(default, help, ...)`; the flags of `dualjax run`,
`launch.main`, `dualjax sim` and the argv `verify` rebuilds for mpiexec are derived from these
declarations (`add_flags`, `from_args`, `to_argv`), so a new setting is one line here. Every host
builds the same `RunConfig` from the same flags; the store's fingerprint check then catches a model
or layout that does not match an existing store at start-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import types
import typing


class ConfigError(ValueError):
    """A bad flag or config value; the message says which and what is allowed."""


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """P prefill hosts and D decode hosts. Rank 0 is the scheduler, then P prefill, then D decode."""

    prefill: int
    decode: int

    def __post_init__(self):
        if self.prefill < 1 or self.decode < 1:
            raise ConfigError(f"a cluster needs at least one prefill and one decode host, got "
                              f"{self.prefill}p{self.decode}d")

    @classmethod
    def parse(cls, text: str) -> "ClusterSpec":
        m = re.fullmatch(r"(\d+)p(\d+)d", text.strip().lower())
        if not m:
            raise ConfigError(f"unknown cluster {text!r}: expected PpDd, e.g. 1p1d, 2p1d, 1p2d")
        return cls(int(m.group(1)), int(m.group(2)))

    @property
    def name(self) -> str:
        return f"{self.prefill}p{self.decode}d"

    @property
    def size(self) -> int:
        return 1 + self.prefill + self.decode

    @property
    def prefill_ranks(self) -> list[int]:
        return list(range(1, 1 + self.prefill))

    @property
    def decode_ranks(self) -> list[int]:
        return list(range(1 + self.prefill, self.size))

    def role(self, rank: int) -> str:
        if rank == 0:
            return "scheduler"
        if rank in self.prefill_ranks:
            return "prefill"
        if rank in self.decode_ranks:
            return "decode"
        raise ConfigError(f"rank {rank} is outside cluster {self.name} ({self.size} ranks)")


COMPILE_CACHE_ENV = "DUALJAX_COMPILE_CACHE"  # directory of JAX's persistent compilation cache; "off": none


def use_compile_cache(environ=None) -> str | None:
    """Point JAX's persistent compilation cache at $DUALJAX_COMPILE_CACHE (default
    ~/.cache/dualjax/jax; "off" turns it off) unless JAX_COMPILATION_CACHE_DIR is set already, by
    setting the environment JAX reads when it is first imported: in this process if JAX is not
    loaded yet, and in every process it starts (mpiexec's ranks). Programs that take 0.1 s or more
    to compile are cached, so a second run, or a rank after another, loads what was compiled
    before instead of compiling it again (the run's clock never includes either: hosts compile
    before it starts). Returns the directory, or None."""
    environ = os.environ if environ is None else environ
    where = environ.get(COMPILE_CACHE_ENV, os.path.join("~", ".cache", "dualjax", "jax"))
    if where == "off":
        return environ.get("JAX_COMPILATION_CACHE_DIR")
    environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.expanduser(where))
    environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
    return environ["JAX_COMPILATION_CACHE_DIR"]


def setting(default, help: str, *, flag: str | None = None, negate: str | None = None, parse=None,
            cli: bool = True, factory=None):
    """A config field with its flag: `flag` overrides the name (default --field-name), `negate`
    makes a store_false flag of that name for a True-default bool, `parse` turns the flag's text
    into the value, `cli=False` keeps it off the command line (a programmatic setting)."""
    meta = {"help": help, "flag": flag, "negate": negate, "parse": parse, "cli": cli}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("negate") or f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _base_type(cls, f: dataclasses.Field):
    """(type, optional) of a field's annotation, e.g. (int, True) for `int | None`."""
    hint = typing.get_type_hints(cls)[f.name]
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return hint, False


def add_flags(parser: argparse.ArgumentParser, cls, *, skip: tuple[str, ...] = (), required=()) -> None:
    """One flag per `setting` field of the config dataclass `cls` (its type, default and help)."""
    for f in dataclasses.fields(cls):
        if not f.metadata.get("cli", False) or f.name in skip:
            continue
        typ, _ = _base_type(cls, f)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        shown = getattr(default, "name", default)
        help_ = f"{f.metadata['help']} (default: {shown})" if default is not None else f.metadata["help"]
        if f.metadata.get("negate"):
            parser.add_argument(_flag(f), dest=f.name, action="store_false", default=default,
                                help=f.metadata["help"])
        elif typ is bool:
            parser.add_argument(_flag(f), dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                                help=help_)
        else:
            parse = f.metadata.get("parse") or typ
            parser.add_argument(_flag(f), dest=f.name, type=parse, default=default, help=help_,
                                required=f.name in required)


def from_args(cls, args: argparse.Namespace, **overrides):
    """The config `cls` from parsed flags (fields without a flag keep their defaults)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
              if f.metadata.get("cli", False) and hasattr(args, f.name)}
    return cls(**(values | overrides))


def to_argv(cfg) -> list[str]:
    """Flags that rebuild `cfg` through `add_flags` + `from_args` (every non-default setting)."""
    argv = []
    for f in dataclasses.fields(cfg):
        if not f.metadata.get("cli", False):
            continue
        value = getattr(cfg, f.name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if value == default:
            continue
        typ, _ = _base_type(type(cfg), f)
        if f.metadata.get("negate"):
            argv.append(_flag(f))
        elif typ is bool:
            argv.append(("--" if value else "--no-") + _flag(f)[2:])
        elif value is not None:
            argv += [_flag(f), str(getattr(value, "name", value))]
    return argv


def number(low: float = 0.0, high: float = math.inf, *, kind=float, low_ok: bool = False, inf_ok: bool = False):
    """argparse type of a flag's number in (`low`, `high`] (`low_ok`: [`low`, `high`]), finite unless
    `inf_ok`, an int with `kind=int`: anything else is bad input before the command starts."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if not (value >= low if low_ok else value > low) or not value <= high or not (inf_ok or math.isfinite(value)):
            bounds = f"{'>=' if low_ok else '>'} {low:g}" + (f" and <= {high:g}" if high < math.inf else "")
            raise argparse.ArgumentTypeError(f"must be a {'' if inf_ok else 'finite '}number {bounds}, got {text}")
        return value
    return parse


def _positive(cfg, *names: str, finite: bool = False) -> None:
    """Each of `names` is None or a number > 0 (not NaN; with `finite`, not infinite either)."""
    for name in names:
        value = getattr(cfg, name)
        if value is not None and not (value > 0 and (not finite or math.isfinite(value))):
            raise ConfigError(f"{name} must be positive{' and finite' if finite else ''}, got {value}")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a real run and a simulation share: cluster, model, workload, policy and prefill knobs."""

    cluster: ClusterSpec = setting(None, "PpDd: P prefill hosts, D decode hosts", parse=str,
                                   factory=lambda: ClusterSpec(1, 1))
    model: str = setting("tiny", "model preset (tiny, small, deepseek-tiny, ...) or checkpoint directory (Hugging "
                         "Face config.json + *.safetensors, or Orbax model_config.json; docs/models.md)")
    workload: str = setting("agentic-tiny", "preset (agentic-tiny, agentic-small, agentic-e2e, paper-32k/48k/64k), "
                            "a trajectory file *.jsonl, mooncake:PATH[:LIMIT[:LENGTH_SCALE]] or "
                            "sessions:PATH[:LIMIT[:LENGTH_SCALE]]")
    agents: int | None = setting(None, "override the preset's number of agents")
    turns: int | None = setting(None, "override the preset's turns per agent")
    policy: str = setting("dualpath", "read-path policy: basic, pe-only, de-only, round-robin, random, dualpath, "
                          "dualpath-split, dualpath-recompute (plans: docs/policies.md), or pkg.module:ClassName")
    aps: float | None = setting(None, "online mode: agents arrive as a Poisson process at APS agents/s")
    layerwise: bool | None = setting(None, "layerwise prefill (default: the policy's; Basic is not layerwise)")
    use_store: bool = setting(True, "reference run: no store, every prompt recomputed", negate="--no-store")
    snic_mbps: float | None = setting(None, "per-host storage NIC read rate delivered, MB/s: the cap a real host's "
                                      "reads get, the rate a simulated node's reads get (default: uncapped / the "
                                      "profile's line rate x its storage efficiency)")
    block_tokens: int = setting(64, "tokens per KV block")
    prefill_chunk: int = setting(2048, "most new tokens of one request in one prefill pass (bounds attention "
                                 "memory)")
    compute_quota_ms: float = setting(
        300.0, "predicted time of one attention layer over the batch a PE packs into one pass (docs/paper.md §7)")
    scheduler: str = setting("full", "full: inter-engine (alpha/beta/Z) and intra-engine (the compute quota) "
                             "scheduling, docs/paper.md §7; naive: neither (round-robin engines, a PE packs every "
                             "ready request; the ablation's dual-path step)")
    de_memory: str = setting("resident", "what a DE's free device memory counts in the scheduler's DE rule "
                             "(docs/paper.md §7): resident (the KV in its device memory now: a request takes it when "
                             "its prompt KV moves in after prefill, docs/paper.md §3, and placement runs ahead up to "
                             "what the DE buffer holds) or reserved (promised to every placed request from "
                             "placement to its last token)")
    pe_hbm_mb: float | None = setting(None, "device memory a PE has for the KV of its passes, MB: Basic holds every "
                                      "layer of its batches' prompt KV, layerwise --layerwise-layers layers "
                                      "(default: the hardware's)")
    basic_ahead: int = setting(0, "without layerwise prefill (Basic): batches a PE may load ahead of the one it "
                               "computes (0: load a batch, compute it, then load the next)")
    basic_lands: str = setting("hbm", "without layerwise prefill (Basic): where a batch loaded ahead waits: hbm "
                               "(device memory holds every batch loading or loaded) or host (the PE buffer holds "
                               "them; device memory only the batch computing)")
    layerwise_layers: int = setting(2, "layers of a pass's KV a layerwise PE holds in device memory: 1 (load, use, "
                                    "free) or 2 (the next layer loads while one computes)")
    workload_seed: int = setting(0, "workload seed", flag="--seed")
    think_time: str = setting("zero", "sessions: pause before each turn: zero (the paper's rule), recorded (the "
                              "trace's tool/user time) or a factor on the recorded pauses")

    def __post_init__(self):
        if isinstance(self.cluster, str):  # "1p2d", as flags and notebooks give it
            object.__setattr__(self, "cluster", ClusterSpec.parse(self.cluster))
        if not isinstance(self.cluster, ClusterSpec):
            raise ConfigError(f"cluster must be a ClusterSpec (e.g. ClusterSpec.parse('1p1d')), got {self.cluster!r}")
        _positive(self, "aps", "snic_mbps")  # infinite: arrivals all at once, an uncapped NIC
        _positive(self, "block_tokens", "prefill_chunk", "compute_quota_ms", "agents", "turns", "pe_hbm_mb",
                  finite=True)
        if self.workload_seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.workload_seed}")
        if self.basic_ahead < 0:
            raise ConfigError(f"basic_ahead must be >= 0, got {self.basic_ahead}")
        if self.basic_lands not in ("hbm", "host"):
            raise ConfigError(f"basic_lands must be 'hbm' or 'host', got {self.basic_lands!r}")
        if self.layerwise_layers not in (1, 2):
            raise ConfigError(f"layerwise_layers must be 1 or 2, got {self.layerwise_layers}")
        if self.de_memory not in ("resident", "reserved"):
            raise ConfigError(f"de_memory must be 'resident' or 'reserved', got {self.de_memory!r}")
        if self.scheduler not in ("full", "naive"):
            raise ConfigError(f"scheduler must be 'full' or 'naive', got {self.scheduler!r}")
        if self.think_time not in ("zero", "recorded") and not re.fullmatch(r"\d+(\.\d*)?|\.\d+", self.think_time):
            raise ConfigError(f"think_time must be zero, recorded or a factor >= 0, got {self.think_time!r}")
        from dualjax.core.policies import layerwise_conflict
        if (why := layerwise_conflict(self.policy, self.layerwise)) is not None:
            raise ConfigError(why)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class RunConfig(Settings):
    """One real run (embedded or under MPI)."""

    pe_buffer_mb: float = setting(512.0, "PE host buffer, MB")
    de_buffer_mb: float = setting(512.0, "DE host buffer, MB")
    decode_slots: int = setting(8, "sequences a decode host decodes together")
    store: str | None = setting(None, "the KV store, one that every host reaches: a directory (POSIX I/O), or "
                                "through TensorStore a kvstore URL (file:///shared/kv/, gs://bucket/kv/, "
                                "s3://bucket/kv/), a JSON kvstore spec or a .json file of one (docs/store.md; "
                                "default: OUT/store)")
    store_gb: float | None = setting(None, "KV store byte budget in GB, LRU-evicted (default: the store filesystem's "
                                     "free space less a margin; required for a store without a filesystem: gs://, "
                                     "s3://, memory://)")
    out: str = setting("runs/latest", "output directory: requests.parquet, report.json, plots (docs/report.md) "
                       "and the store unless --store")
    hostfile: str | None = setting(None, "run across hosts: a file of one HOST[:N] per line, or 'slurm' for "
                                   "SLURM_JOB_NODELIST; PEs take the first nodes, DEs the next, the scheduler "
                                   "runs on the first (docs/cluster.md)")
    hash_seed: int = setting(0, "block hash seed", cli=False)
    param_seed: int = setting(0, "random-weight seed", cli=False)

    def __post_init__(self):
        super().__post_init__()
        _positive(self, "pe_buffer_mb", "de_buffer_mb", "decode_slots", "store_gb", finite=True)

    @property
    def store_dir(self) -> str:
        return self.store or f"{self.out.rstrip('/')}/store"


@dataclasses.dataclass(frozen=True)
class SimConfig(Settings):
    """One simulation: the same settings as a real run where they exist, on a hardware profile."""

    cluster: ClusterSpec = setting(None, "PpDd in nodes", parse=str, factory=lambda: ClusterSpec(2, 4))
    model: str = setting("deepseek-v3.2", "deepseek-v3.2 or a model preset")
    workload: str = setting("paper-64k", "a workload preset, a trajectory file *.jsonl, "
                            "mooncake:PATH[:LIMIT[:LENGTH_SCALE]] or sessions:PATH[:LIMIT[:LENGTH_SCALE]]")
    hardware: str = setting("paper-h800", "paper-h800, oracle, local (from `dualjax calibrate`) or a profile JSON "
                            "file")
    window_s: float = setting(1.0, "storage-NIC balance and bandwidth plot window, s", cli=False)
