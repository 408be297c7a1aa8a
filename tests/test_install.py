"""The same install everywhere: ``make`` installs exactly uv.lock's packages, a cluster's nodes
install the same ones (``cluster/requirements*.txt``, the lock's exports, from ``ray_cluster.yaml``),
and pyproject.toml's ranges hold the locked versions."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from .conftest import REPO

UV = Path(sys.executable).parent / "uv"  # make's, in the venv
CORE = ("ray", "tensorflow", "keras", "keras-hub", "mlflow", "optuna")  # their undocumented parts: next minor only


def exported(*extras: str) -> str:
    """uv.lock's packages with ``extras``, as ``make lock`` exports them for the cluster."""
    command = [str(UV), "export", "--frozen", "--no-emit-project", "--no-header", *[f"--extra={e}" for e in extras]]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True).stdout


def pins(requirements: str) -> dict[str, str]:
    """``name: version`` of a requirements file's ``name==version`` lines."""
    lines = [line.split(";")[0].strip() for line in requirements.splitlines() if "==" in line and not line.startswith("#")]
    return {canonicalize_name(name): found for name, found in (line.split("==") for line in lines)}


def test_this_environment_holds_exactly_the_locked_packages_make_installs():
    wanted = pins(exported("dev"))
    assert {"ray", "tensorflow", "mlflow", "pytest"} <= set(wanted)
    found = {}
    for name in wanted:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    assert {name: (v, found[name]) for name, v in wanted.items() if Version(v) != Version(found[name] or "0")} == {}


@pytest.mark.parametrize(("file", "extras"), [("requirements.txt", ("bohb",)), ("requirements-gpu.txt", ("bohb", "gpu"))])
def test_the_cluster_files_are_the_locks_exports_with_a_hash_for_every_package(file, extras):
    text = (REPO / "cluster" / file).read_text()
    assert text.split("\n", 1)[1] == exported(*extras), f"cluster/{file} is not uv.lock's export: run make lock"
    entries = re.split(r"\n(?=[a-z0-9])", text.split("\n", 1)[1])  # a package's line, its hashes, its "via"
    assert len(entries) == len(pins(text)) > 100
    assert [entry.split()[0] for entry in entries if "--hash=sha256:" not in entry] == []


def test_every_node_installs_the_locked_files_and_detsweep_without_resolving_again():
    config = yaml.safe_load((REPO / "ray_cluster.yaml").read_text())
    assert config["setup_commands"][-2:] == [
        "pip install --quiet --no-deps -r /home/ray/detsweep/cluster/requirements.txt",
        "pip install --quiet --no-deps -e /home/ray/detsweep"]
    assert config["file_mounts"]["/home/ray/detsweep"] == "."
    image = config["docker"]["image"]
    assert image == f"rayproject/ray:{pins(exported())['ray']}-py311-gpu", image  # the lock's Ray, detsweep's Python


def test_pyprojects_ranges_hold_the_locked_versions_and_bound_the_core_libraries_to_their_minor():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    locked = {canonicalize_name(p["name"]): p["version"] for p in tomllib.loads((REPO / "uv.lock").read_text())["package"]}
    declared = [Requirement(r) for r in project["dependencies"] + sum(project["optional-dependencies"].values(), [])]
    for requirement in (r for r in declared if canonicalize_name(r.name) != "detsweep"):
        held = Version(locked[canonicalize_name(requirement.name)])
        assert held in requirement.specifier, (str(requirement), held)
        assert any(spec.operator == "<" for spec in requirement.specifier), f"{requirement}: no upper bound"
    for name in CORE:
        [requirement] = [r for r in declared if canonicalize_name(r.name) == name and not r.extras - {"default", "train", "tune", "auth"}]
        held = Version(locked[name])
        assert f"<{held.major}.{held.minor + 1}" in str(requirement.specifier), str(requirement)
