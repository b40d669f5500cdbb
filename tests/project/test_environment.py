"""The pinned environment (issue 36): the lock CI installs satisfies pyproject.toml's ranges, and
each range's lower bound is the version the lock tests."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCKED_EXTRAS = ("test", "llm", "ray", "notebook", "glove")


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split("==")
            pins[_name(name)] = Version(version.split()[0])
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [r for e in LOCKED_EXTRAS for r in project["optional-dependencies"][e]]
    return [Requirement(r) for r in listed]


def test_the_lock_satisfies_every_range_and_its_lower_bound_is_the_tested_version():
    lock = _lock()
    torch = Requirement((ROOT / "requirements" / "torch.txt").read_text().strip())
    for req in _requirements():
        if _name(req.name) == "torch":  # pinned on its own (CPU or CUDA build)
            version = Version(next(iter(torch.specifier)).version)
        else:
            assert _name(req.name) in lock, f"{req.name} is not in requirements/lock.txt"
            version = lock[_name(req.name)]
        assert req.specifier.contains(version, prereleases=True), f"{req.name}: lock has {version}"
        lower = [Version(s.version) for s in req.specifier if s.operator == ">="]
        if lower:
            assert lower[0] == version or lower[0].release == version.release[:len(lower[0].release)], \
                f"{req.name}: the lower bound {lower[0]} is not the tested {version}"


def test_ci_installs_the_lock():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "-r requirements/lock.txt" in ci and "--no-deps -e ." in ci
    assert "pytest" in ci.splitlines()[-1]


def test_this_environment_is_the_lock():
    """Run where CI runs: every locked package installed here has the locked version."""
    lock = _lock()
    if metadata.version("transformers") != str(lock["transformers"]):
        pytest.skip("not the locked environment (pip install -r requirements/lock.txt)")
    installed = {_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    off = {n: (str(v), installed[n]) for n, v in lock.items() if n in installed and installed[n] != str(v)}
    assert off == {}
