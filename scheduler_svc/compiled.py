"""The scheduler core and the simulator compiled with mypyc, for long simulations.

A simulated iteration is Python work per job (the batch's walk, its commands, their results):
interpreted, a million Azure conversations at twice FCFS's capacity took 231 s here, compiled
77 s (docs/benchmarks.md).
mypyc (part of mypy) compiles the type-annotated modules of ``MODULES`` as they are, into C
extensions; nothing is written twice, and the figures are the same to the digit
(``tests/scheduler_svc/test_compiled.py``).

``activate()`` builds them once per source version (a hash of the sources, mypy's version and
the interpreter names the build, under ``$FASTSERVE_CACHE_DIR/compiled-core``), and puts an
import finder in front so that the next imports of those modules load the compiled ones. It
must run before any of them is imported (``fastserve sim`` calls it first thing); anything in
the way (no mypy, no C compiler, a failed build, a module already imported, or
``FASTSERVE_COMPILED=0``) leaves the process on the interpreted modules, with one warning.
The services never call it: only the simulator runs compiled.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parent.parent
# What a simulated iteration runs through: the core (not its config and cost model, read once
# per run) and the simulator's loop. Compiled together: their classes are native to each other.
MODULES = (
    "scheduler_svc.core.job", "scheduler_svc.core.contract", "scheduler_svc.core.step_context",
    "scheduler_svc.core.batcher", "scheduler_svc.core.start_reserve", "scheduler_svc.core.group",
    "scheduler_svc.core.steady",
    "scheduler_svc.core.kv.allocator", "scheduler_svc.core.kv.ledger",
    "scheduler_svc.core.kv.displace", "scheduler_svc.core.kv.policies",
    "scheduler_svc.core.policies.base", "scheduler_svc.core.policies.starvation",
    "scheduler_svc.core.policies.bucket_index", "scheduler_svc.core.policies.rank_key",
    "scheduler_svc.core.policies.ranked",
    "scheduler_svc.core.policies.repeated_sum",
    "scheduler_svc.core.policies.fcfs", "scheduler_svc.core.policies.mlfq",
    "scheduler_svc.core.policies.priority", "scheduler_svc.core.policies.predictive",
    "scheduler_svc.sim.pipeline", "scheduler_svc.sim.simulator",
)
# mypyc compiles what type-checks; the project's strict settings are for `make lint`.
KEEP_BUILDS = 4  # source versions whose builds stay in the cache
MYPY_INI = "[mypy]\nignore_missing_imports = True\nfollow_imports = silent\n"


def _source(module: str) -> pathlib.Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def build_key() -> str | None:
    """The build's name: a hash of the sources, mypy's version and the interpreter; None
    without mypy."""
    try:
        from mypy.version import __version__ as mypy_version
    except ImportError:
        return None
    h = hashlib.sha256()
    for module in MODULES:
        h.update(module.encode() + b"\0" + _source(module).read_bytes() + b"\0")
    h.update(f"{mypy_version}\0{sys.version}\0{sys.platform}\0{MYPY_INI}".encode())
    return h.hexdigest()[:16]


def build_dir(key: str) -> pathlib.Path:
    from fastserve.models import cache_dir

    return cache_dir() / "compiled-core" / key


def build(key: str) -> pathlib.Path:
    """Compile ``MODULES`` into ``build_dir(key)`` (once: another process building the same
    key waits for it). Raises RuntimeError with the compiler's last lines when it fails."""
    from fastserve.models import locked

    target = build_dir(key)
    with locked(f"compiled-core-{key}"):
        if target.is_dir():
            return target
        cc = os.environ.get("CC", "cc")
        if shutil.which(cc) is None:
            raise RuntimeError(f"no C compiler ({cc!r} not found)")
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="fastserve-mypyc-") as tmp:
            work = pathlib.Path(tmp)
            # A copy of the package's sources: mypyc writes its build files beside them.
            shutil.copytree(ROOT / "scheduler_svc", work / "scheduler_svc",
                            ignore=shutil.ignore_patterns("__pycache__", "*.so"))
            (work / "mypy.ini").write_text(MYPY_INI)
            paths = [str(_source(m).relative_to(ROOT)) for m in MODULES]
            (work / "setup.py").write_text(
                "from setuptools import setup\nfrom mypyc.build import mypycify\n"
                f"setup(name='fastserve-compiled-core', ext_modules=mypycify("
                f"['--config-file', 'mypy.ini', *{paths!r}], opt_level='3'))\n")
            out = pathlib.Path(tempfile.mkdtemp(prefix=f".{key}.", dir=target.parent))
            started = time.monotonic()
            print(f"compiling the scheduler core with mypyc, once for this source version "
                  f"(20 s here): {target}", file=sys.stderr, flush=True)
            done = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib",
                                   str(out)], cwd=work, capture_output=True, text=True)
            if done.returncode != 0:
                shutil.rmtree(out, ignore_errors=True)
                tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
                raise RuntimeError(f"mypyc failed (exit {done.returncode}):\n{tail}")
            os.replace(out, target)
            print(f"compiled in {time.monotonic() - started:.0f} s", file=sys.stderr,
                  flush=True)
            _prune(target.parent)
    return target


def _prune(parent: pathlib.Path, keep: int = KEEP_BUILDS) -> None:
    """Remove all but the ``keep`` builds used last (each source version makes one)."""
    builds = sorted((d for d in parent.iterdir() if d.is_dir() and not d.name.startswith(".")),
                    key=lambda d: d.stat().st_mtime, reverse=True)
    for old in builds[keep:]:
        shutil.rmtree(old, ignore_errors=True)


class _Finder(importlib.abc.MetaPathFinder):
    """Loads the modules of one build from its extension files, ahead of the sources."""

    def __init__(self, table: dict[str, pathlib.Path]):
        self.table = table

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        so = self.table.get(fullname)
        if so is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(so))
        return importlib.util.spec_from_file_location(fullname, so, loader=loader)


def _table(where: pathlib.Path) -> dict[str, pathlib.Path]:
    """Module name -> extension file, for every extension of a build (its modules and
    mypyc's shared library, a top-level module)."""
    table = {}
    for so in where.rglob("*.so"):
        parts = so.relative_to(where).parts
        table[".".join([*parts[:-1], parts[-1].split(".")[0]])] = so
    return table


def active() -> bool:
    """Whether this process runs the compiled modules."""
    return any(isinstance(f, _Finder) for f in sys.meta_path)


def activate() -> bool:
    """Run the compiled modules from the next import on, building them first if needed.
    Returns whether it did; warns (stderr) why not."""
    if active():
        return True
    if os.environ.get("FASTSERVE_COMPILED", "1") == "0":
        return False
    loaded = [m for m in MODULES if m in sys.modules]
    if loaded:
        _warn(f"{loaded[0]} is already imported")
        return False
    key = build_key()
    if key is None:
        _warn("mypy (mypyc) is not installed: pip install 'mypy>=2.4,<2.5'")
        return False
    try:
        where = build(key)
    except (RuntimeError, OSError) as e:
        _warn(str(e))
        return False
    os.utime(where)  # used now: _prune keeps the builds used last
    table = _table(where)
    missing = [m for m in MODULES if m not in table]
    if missing:
        _warn(f"the build in {where} lacks {missing[0]}")
        return False
    sys.meta_path.insert(0, _Finder(table))
    return True


def _warn(why: str) -> None:
    print(f"warning: the simulator runs interpreted (2-3.5x slower): {why}", file=sys.stderr,
          flush=True)
