"""The architecture's rules, enforced: which package may import which, no cycles, no private names
across modules, TensorStore only where the store is, and a core and simulator that load without JAX,
TensorStore or MPI."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("models", "kvstore", "dualjax", "launch")
# models' modules the simulator and core tooling may use: plain Python and NumPy, no JAX
JAX_FREE_MODELS = {"models", "models.config", "models.presets", "models.costs", "models.buckets", "models.dense",
                   "models.dense.config", "models.dense.costs", "models.deepseek", "models.deepseek.config",
                   "models.deepseek.costs"}

# layer -> the layers it may import (besides itself and third-party packages)
ALLOWED = {
    "models": set(),
    "kvstore": set(),
    "dualjax": set(),  # the package root imports nothing
    "dualjax.core": set(),
    "dualjax.plots": set(),
    "dualjax.outputs": {"dualjax.core", "dualjax.plots"},
    "dualjax.sim": {"dualjax.core", "dualjax.outputs", "dualjax.plots", "models:jax-free"},
    "dualjax.runtime": {"dualjax.core", "dualjax.outputs", "dualjax.plots", "models", "kvstore"},
    "dualjax.bench": {"dualjax.core", "dualjax.outputs", "dualjax.plots", "dualjax.runtime", "models", "kvstore"},
    "dualjax.cli": {"dualjax.core", "dualjax.outputs", "dualjax.plots", "dualjax.runtime", "dualjax.sim",
                    "dualjax.bench", "models", "kvstore"},
    "launch": {"dualjax.core", "dualjax.runtime"},
}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    """The longest ALLOWED key that is `module` or a package above it."""
    return max((k for k in ALLOWED if module == k or module.startswith(k + ".")), key=len)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports(path: pathlib.Path, name: str, known: set[str]) -> list[tuple[str, list[str]]]:
    """(imported project module, imported names) for every import in the file, lazy ones included."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.split(".")[0] in PACKAGES]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] not in PACKAGES:
                continue
            names = [a.name for a in node.names]
            subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in known]  # `from pkg import module`
            out += [(s, []) for s in subs] + [(base, [n for n in names if f"{base}.{n}" not in known])]
    return out


def graph() -> dict[str, list[tuple[str, list[str]]]]:
    mods = modules()
    return {m: imports(p, m, set(mods)) for m, p in mods.items()}


def test_imports_only_point_down():
    bad = []
    for src, targets in graph().items():
        for dst, _ in targets:
            a, b = layer(src), layer(dst)
            if a == b:
                continue
            allowed = ALLOWED[a]
            if b == "models" and "models:jax-free" in allowed and dst in JAX_FREE_MODELS:
                continue
            if b not in allowed:
                bad.append(f"{src} -> {dst}")
    assert not bad, "imports against the layering (see dualjax/__init__.py):\n" + "\n".join(sorted(set(bad)))


def test_no_import_cycles():
    # an edge from a module into its own package's __init__ (a re-export) is not a dependency
    edges = {src: {dst for dst, _ in targets if dst != src and not src.startswith(dst + ".")}
             for src, targets in graph().items()}
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(edges.get(m, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif not state.get(d):
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(edges):
        if not state.get(m):
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_private_names_across_modules():
    bad = [f"{src} imports {dst}.{n}" for src, targets in graph().items() for dst, names in targets
           for n in names if n.startswith("_") and dst != src]
    assert not bad, "private names used outside their module:\n" + "\n".join(bad)


# modules (and packages) that may import TensorStore: the store, which owns its kvstores and their
# locations, and the storage benchmark, which measures TensorStore's own formats beside the store's
TENSORSTORE_USERS = ("kvstore", "dualjax.bench.kvstore")


def third_party(path: pathlib.Path) -> set[str]:
    """The top-level packages the file imports, lazy imports included, relative ones not."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names - set(PACKAGES)


def test_only_the_store_imports_tensorstore():
    bad = [m for m, p in modules().items() if "tensorstore" in third_party(p)
           and not any(m == u or m.startswith(u + ".") for u in TENSORSTORE_USERS)]
    assert not bad, "TensorStore imported outside " + ", ".join(TENSORSTORE_USERS) + ":\n" + "\n".join(bad)


BLOCKED = ("jax", "jaxlib", "flax", "orbax", "tensorstore", "mpi4py", "safetensors")


def test_core_and_simulator_import_without_jax_tensorstore_or_mpi():
    code = "\n".join([
        "import importlib, pkgutil, sys",
        *[f"sys.modules[{m!r}] = None" for m in BLOCKED],  # `import jax` now raises ImportError
        "import dualjax.core, dualjax.sim",
        "for pkg in (dualjax.core, dualjax.sim):",
        "    for info in pkgutil.iter_modules(pkg.__path__):",
        "        importlib.import_module(f'{pkg.__name__}.{info.name}')",
        "import dualjax.core.scheduler as s, dualjax.core.policies as p, dualjax.sim as sim",
        "assert not any(m in sys.modules and sys.modules[m] is not None for m in " + repr(BLOCKED) + ")",
        "print('ok')",
    ])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_a_new_run_setting_is_one_line():
    """Flags of `dualjax run`, `launch.main` and `dualjax sim` come from the config dataclasses, and the argv
    rebuilt for mpiexec round-trips every setting."""
    import argparse

    from dualjax.core.config import RunConfig, SimConfig, add_flags, from_args, to_argv
    cfg = RunConfig(cluster="1p2d", model="small", workload="agentic-e2e", agents=3, policy="pe-only",
                    layerwise=False, use_store=False, snic_mbps=5.0, prefill_chunk=512, workload_seed=7, out="x")
    p = argparse.ArgumentParser()
    add_flags(p, RunConfig)
    assert from_args(RunConfig, p.parse_args(to_argv(cfg))) == cfg
    sim = SimConfig(cluster="4p4d", agents=10, aps=0.5, hardware="oracle")
    p = argparse.ArgumentParser()
    add_flags(p, SimConfig)
    assert from_args(SimConfig, p.parse_args(to_argv(sim))) == sim
