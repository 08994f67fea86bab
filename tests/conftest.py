"""Hypothesis profiles for the whole suite.

- ``default``: 100 examples per property, for an ordinary local run;
- ``ci``: 300 examples, loaded whenever ``CI`` is set (the state-machine tests stay
  well under a minute on two cores);
- ``dev``: 20 examples, for quick iterations (``HYPOTHESIS_PROFILE=dev``);
- ``mutation``: 100 examples, derandomized and without the example database, for the
  mutation run (``HYPOTHESIS_PROFILE=mutation``, see tests/README.md, "Mutation testing"),
  with Hypothesis' pool of constants from the imported modules emptied (see
  ``freeze_local_constants``): a test generates the same examples every time, under
  mutmut as in a fresh process, whatever was imported before it.

``deadline=None`` everywhere: one example walks a conversation through dozens of
reducer steps and checks every invariant after each, so its run time is legitimately
tens of milliseconds and varies with the machine; a deadline would only make CI flaky.
No health check is suppressed here.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from pg_cluster import NOT_INSTALLED, Cluster, find_binaries

settings.register_profile("default", max_examples=100, deadline=None)
settings.register_profile("ci", max_examples=300, deadline=None, print_blob=True)
settings.register_profile("dev", max_examples=20, deadline=None)
settings.register_profile(
    "mutation", max_examples=100, deadline=None, derandomize=True, database=None
)
PROFILE = "ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "default")
settings.load_profile(PROFILE)


def share_bytecode() -> None:
    """Where the environment turns bytecode caching off (``PYTHONDONTWRITEBYTECODE``),
    let this session and the Python processes its tests start (``fanfold`` CLI runs,
    workers, MCP servers: hundreds) keep compiled bytecode in a cache of their own
    outside the source tree (``PYTHONPYCACHEPREFIX``: ``$XDG_CACHE_HOME/fanfold/test-pycache``),
    as ``bench/kill9_campaign.py`` does: otherwise every one of them compiled fanfold's
    sources again, a quarter of the CPU time of a ``fanfold`` start. Nothing is changed
    where caching is on, a prefix is already chosen, or the cache cannot be made."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cache = cache / "fanfold" / "test-pycache"
    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = str(cache)
    sys.pycache_prefix = str(cache)
    sys.dont_write_bytecode = False


share_bytecode()


def freeze_local_constants() -> None:
    """Make generation independent of what the process imported.

    Hypothesis (6.170 here) draws, with a small probability per draw, a constant
    found in the source of the *local* modules in ``sys.modules`` (fanfold's, not
    tests or site-packages), and rescans whenever ``sys.modules`` grows. So a
    derandomized test generated other examples after ``fanfold.cli`` was imported
    (mutmut's runner collects the whole selection first), and under mutmut, whose
    mutated copies of the modules hold other constants, than in a fresh process
    (issue 26). The mutation profile replaces that pool by an empty one (the fixed
    global constants, 0, -1, NaN, "", ... are still drawn). No public setting does
    this: if Hypothesis renames the hook, this fails loudly, and
    ``tests/test_hypothesis_determinism.py`` checks the result either way.
    """
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.constants_ast import Constants

    if not hasattr(providers, "_get_local_constants"):
        raise RuntimeError("hypothesis no longer has providers._get_local_constants")
    empty = Constants()
    setattr(providers, "_get_local_constants", lambda: empty)  # noqa: B010
    providers.CONSTANTS_CACHE.cache.clear()


if PROFILE == "mutation":
    freeze_local_constants()


def _record_examples(path: str) -> None:
    """Write, at the end of the session, a digest of every example each property test
    generated (its printed form) to ``path``: ``tests/test_hypothesis_determinism.py``
    compares two processes' digests.

    Hypothesis traces the coverage of every example once a callback is registered;
    on Python 3.11 (``sys.settrace``) that made the recorded run four to five times
    slower (the determinism test took over 30 s under load). The digest needs only
    the printed examples, and tracing does not change what is generated, so it is
    switched off (Hypothesis documents ``_should_trace`` reading this attribute as
    one to monkeypatch; the environment variable for it would also write every
    observation to ``.hypothesis/observed``)."""
    from hypothesis.internal import observability
    from hypothesis.internal.observability import (
        Observation,
        add_observability_callback,
    )

    if not hasattr(observability, "OBSERVABILITY_COLLECT_COVERAGE"):
        raise RuntimeError("hypothesis no longer has OBSERVABILITY_COLLECT_COVERAGE")
    observability.OBSERVABILITY_COLLECT_COVERAGE = False

    seen: dict[str, list[str]] = {}

    def record(observation: Observation) -> None:
        if observation.type == "test_case":
            seen.setdefault(observation.property, []).append(observation.representation)

    def write() -> None:
        digests = {
            name: [len(shown), hashlib.sha256("\n\0".join(shown).encode()).hexdigest()]
            for name, shown in seen.items()
        }
        Path(path).write_text(json.dumps(digests, sort_keys=True))

    add_observability_callback(record)
    atexit.register(write)


if os.environ.get("FANFOLD_EXAMPLES_DIGEST"):
    _record_examples(os.environ["FANFOLD_EXAMPLES_DIGEST"])


@pytest.fixture(autouse=True)
def provenance_key(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test's runtimes, forks and CLI processes (which inherit the environment)
    mark and check trees with a key file of the test session, never the user's own."""
    path = tmp_path_factory.getbasetemp() / "provenance.key"
    monkeypatch.setenv("FANFOLD_KEY_FILE", str(path))
    return path


# The suite runs on every core up to two (pytest-xdist: ``-n auto`` in pyproject.toml;
# tests/README.md, "The suite's running time"). Each module is one unit of work, so a
# module's fixtures (a bench of worker processes, a browser) start once and its tests
# run in order; the modules that start workers on PostgreSQL share one unit, so two of
# them never run at once: their leases and kill timings were tuned on one bench at a
# time. (A scheduler of our own: xdist 3.8's ``--dist loadgroup`` renames node ids,
# which pytest 9 no longer lets it do, so its groups were silently ignored.)
PROCESS_HEAVY = ("test_worker_", "test_bench_workers_", "test_bench_kill9_")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: the cores this process may use, at most two."""
    return max(1, min(2, len(os.sched_getaffinity(0))))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """One unit per module, one for all the modules of ``PROCESS_HEAVY``."""
    from xdist.scheduler import LoadFileScheduling

    class ModuleScheduling(LoadFileScheduling):  # type: ignore[misc]  # untyped base
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "process-heavy" if Path(module).name.startswith(PROCESS_HEAVY) else module

    return ModuleScheduling(config, log)


@pytest.fixture(autouse=True)
def trust_record(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test trusts project configuration files in a record of its own
    (``$FANFOLD_TRUST_FILE``), never the user's ~/.config/fanfold/trusted.json."""
    path = tmp_path_factory.mktemp("trust") / "trusted.json"
    monkeypatch.setenv("FANFOLD_TRUST_FILE", str(path))
    return path


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """A throwaway PostgreSQL cluster for the whole session (``tests/pg_cluster.py``):
    initdb in a temporary folder, a server on a free loopback port, stopped and removed
    at the end, also when a test fails (or, by its watchdog, when pytest itself is
    killed). Skipped only where PostgreSQL is not installed; a cluster that is installed
    but cannot start is an error."""
    binaries = find_binaries()
    if binaries is None:
        pytest.skip(NOT_INSTALLED)
    with Cluster.create(binaries) as cluster:
        yield cluster


_PG_DATABASES = itertools.count()


@pytest.fixture
def pg_url(pg_cluster: Cluster) -> Iterator[str]:
    """The URL of a new, empty database of the session's cluster (``pg_cluster``), for
    one test: ``CREATE DATABASE`` takes some 40 ms, far less than a cluster. Skipped,
    saying so, without the postgres extra (psycopg)."""
    psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed")

    name = f"t{os.getpid()}_{next(_PG_DATABASES)}"
    with psycopg.connect(pg_cluster.conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield pg_cluster.url_for(name)
    with psycopg.connect(pg_cluster.conninfo, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgres"])
def log_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new, empty log for ``fanfold.db.open_store``: an SQLite file, then a
    PostgreSQL database (``pg_url``). The store-level tests that take it hold on both."""
    if request.param == "sqlite":
        return str(tmp_path / "fanfold.db")
    return str(request.getfixturevalue("pg_url"))
