"""``make upgrade-check``'s parts that decide (tools/upgrade_check.py), on small inputs: which
bounds it lifts, what a ``--pin`` replaces and which versions it leaves constrained, which versions
it reports as changed, which tests it reports as broken. No install (uv is replaced where it would
run): the real run is ``make upgrade-check`` itself."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

import tools.upgrade_check as upgrade_check
from tools.upgrade_check import (
    arguments,
    check_pins,
    failures,
    install,
    installed_requirements,
    lift_upper_bounds,
    lock_constraints,
    marked_test_files,
    overrides,
    parse_pin,
    pinned_first,
    table,
    tried,
    unchanged_watched,
    version_changes,
)


def test_upper_bounds_are_lifted_and_the_rest_kept():
    assert lift_upper_bounds("ray[default,train,tune]>=2.60,<2.61") == "ray[default,train,tune]>=2.60"
    assert lift_upper_bounds("pkg==1.2") == "pkg>=1.2"
    assert lift_upper_bounds("pkg==1.2.*") == "pkg>=1.2"
    assert lift_upper_bounds("pkg~=1.4.2") == "pkg>=1.4.2"
    assert lift_upper_bounds("pkg>1,<=3,!=2.0") == "pkg!=2.0,>1"  # an exclusion is not a bound
    assert lift_upper_bounds('pkg>=1,<2; python_version < "3.12"') == 'pkg>=1; python_version < "3.12"'
    assert lift_upper_bounds("pkg") == "pkg"


def test_only_the_installed_requirements_with_a_bound_become_overrides():
    project = {"name": "detsweep", "dependencies": ["ray[tune]>=2.60,<2.61", "protobuf>=4.25"],
               "optional-dependencies": {"bohb": ["ConfigSpace>=1.2,<2"], "gpu": ["tensorflow[and-cuda]<3"],
                                         "dev": ["detsweep[bohb]", "ruff>=0.17,<0.18"]}}
    requirements = installed_requirements(project, "dev")
    assert sorted(requirements) == ["ConfigSpace>=1.2,<2", "protobuf>=4.25", "ray[tune]>=2.60,<2.61", "ruff>=0.17,<0.18"]
    # protobuf has no bound to lift: an override would also drop its dependents' upper bounds
    assert sorted(overrides(requirements)) == ["ConfigSpace>=1.2", "ray[tune]>=2.60", "ruff>=0.17"]


def test_the_changed_versions_come_watched_first_then_by_name():
    locked = {"zeta": "1.0", "mlflow": "3.17.2", "ray": "2.60.0", "numpy": "2.4.6", "nvidia-cudnn-cu12": "9.0"}
    installed = {"zeta": "1.1", "MLflow": "3.18.0", "ray": "2.61.0", "numpy": "2.4.6", "alpha": "0.1"}
    rows = version_changes(locked, installed, watched=["ray", "mlflow"])
    # nvidia-cudnn-cu12 is locked, not installed (another extra's): not a change
    assert rows == [("ray", "2.60.0", "2.61.0"), ("mlflow", "3.17.2", "3.18.0"), ("alpha", None, "0.1"),
                    ("zeta", "1.0", "1.1")]
    assert unchanged_watched(locked, installed, watched=["ray", "numpy"]) == ["numpy 2.4.6"]
    assert table(rows[:2] + rows[2:3]) == ["package  uv.lock  now", "ray      2.60.0   2.61.0",
                                           "mlflow   3.17.2   3.18.0", "alpha    -        0.1"]


def test_each_failed_test_is_one_line_with_its_node_id_and_its_error():
    junit = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="2" failures="1"
      skipped="0" tests="4">
      <testcase classname="tests.test_a" name="test_ok" file="tests/test_a.py" line="3" time="0.1"/>
      <testcase classname="tests.test_a.TestParts" name="test_x[1.5]" file="tests/test_a.py" line="9" time="0.1">
        <failure message="AssertionError: 2 != 3&#10;assert 2 == 3">details</failure></testcase>
      <testcase classname="tests.test_b" name="test_y" file="tests/test_b.py" line="1" time="0.1">
        <error message='failed on setup with "ImportError: no keras"'>details</error></testcase>
      <testcase classname="" name="tests.test_c" time="0.0"><error message="collection failure">x</error></testcase>
      <testcase classname="tests.test_d" name="test_z" file="tests/test_d.py" line="1" time="0.1">
        <failure message="AssertionError: 12:00 WARNING token auth&#10;[+27 more lines; full report in element text]">
&gt;       assert result.returncode == 0, result.stderr
E       AssertionError: 12:00 WARNING token auth
E           raise ConnectionError(
E         ConnectionError: Found multiple active Ray instances
E       assert 1 == 0
ValueError: a line of the test's source, not of the error
</failure></testcase>
    </testsuite></testsuites>"""
    assert failures(junit) == ["FAILED tests/test_a.py::TestParts::test_x[1.5]: AssertionError: 2 != 3",
                               'ERROR tests/test_b.py::test_y: failed on setup with "ImportError: no keras"',
                               "ERROR tests.test_c: collection failure",
                               # the error a subprocess's stderr ends with, not the warning it starts with
                               "FAILED tests/test_d.py::test_z: ConnectionError: Found multiple active Ray instances"]


def test_the_files_marked_module_wide_or_per_test_are_found(tmp_path: Path):
    (tmp_path / "test_whole.py").write_text("import pytest\npytestmark = pytest.mark.upgrade_check\n")
    (tmp_path / "test_one.py").write_text("import pytest\n@pytest.mark.upgrade_check\ndef test_x(): pass\n")
    (tmp_path / "test_other.py").write_text("import pytest\n@pytest.mark.upgrade_checks\ndef test_x(): pass\n")
    (tmp_path / "helpers.py").write_text("import pytest\npytestmark = pytest.mark.upgrade_check\n")
    (tmp_path / "test_about.py").write_text('MARKED = "pytestmark = pytest.mark.upgrade_check"\n')  # named, not marked
    assert [path.name for path in marked_test_files(tmp_path)] == ["test_one.py", "test_whole.py"]


PROJECT = {"name": "detsweep", "dependencies": ["ray[default,train,tune]>=2.60,<2.61", "protobuf>=7.36,<8",
                                                 'numpy>=2.4,<3; python_version < "3.13"', "psutil>=7.2"],
           "optional-dependencies": {"bohb": ["ConfigSpace>=1.2,<2"], "dev": ["detsweep[bohb]", "ruff>=0.17,<0.18"]}}


def test_a_pin_replaces_its_package_requirement_in_place_keeping_its_extras():
    requirements = installed_requirements(PROJECT, "dev")
    assert overrides(requirements) == ["ray[default,train,tune]>=2.60", "protobuf>=7.36", 'numpy>=2.4; python_version < "3.13"',
                                       "ruff>=0.17", "ConfigSpace>=1.2"]
    assert overrides(requirements, [parse_pin("ray==2.59.*")]) == [
        "ray[default,train,tune]==2.59.*", "protobuf>=7.36", 'numpy>=2.4; python_version < "3.13"', "ruff>=0.17",
        "ConfigSpace>=1.2"]
    # matched by canonical name; the pin's extras joined to pyproject's, pyproject's marker kept
    assert overrides(requirements, [parse_pin("Ray[client]==2.62.0"), parse_pin("configspace==1.1.*"),
                                    parse_pin("NumPy==2.3.*")]) == [
        "Ray[client,default,train,tune]==2.62.0", "protobuf>=7.36", 'NumPy==2.3.*; python_version < "3.13"',
        "ruff>=0.17", "configspace==1.1.*"]
    # psutil has no bound to lift, grpcio is only another package's requirement: both overridden when pinned
    assert overrides(requirements, [parse_pin("grpcio==1.80.*"), parse_pin("psutil==7.1.0")]) == [
        "ray[default,train,tune]>=2.60", "protobuf>=7.36", 'numpy>=2.4; python_version < "3.13"', "psutil==7.1.0",
        "ruff>=0.17", "ConfigSpace>=1.2", "grpcio==1.80.*"]


LOCK = {"package": [{"name": "detsweep", "version": "0.1.0", "source": {"editable": "."}},
                    {"name": "ray", "version": "2.60.0"}, {"name": "Keras_Hub", "version": "0.32.0"},
                    {"name": "numpy", "version": "2.4.6"}, {"name": "grpcio", "version": "1.85.3"},
                    {"name": "torch", "version": "2.9.0"}, {"name": "torch", "version": "2.9.0+cpu"},
                    {"name": "virtual-thing"}]}


def test_the_constraints_are_uv_locks_versions_but_the_pinned_packages_and_the_project():
    assert lock_constraints(LOCK, [], "detsweep") == ["grpcio==1.85.3", "keras-hub==0.32.0", "numpy==2.4.6",
                                                      "ray==2.60.0"]  # torch: two versions, none constrains it
    assert lock_constraints(LOCK, ["Ray", "keras.hub"], "DetSweep") == ["grpcio==1.85.3", "numpy==2.4.6"]


def test_a_pin_that_cannot_be_tried_is_refused():
    assert arguments([]).pin == []
    assert [str(pin) for pin in arguments(["--pin", "ray==2.59.*", "--pin", "numpy==2.3.*"]).pin] == [
        "ray==2.59.*", "numpy==2.3.*"]
    for wrong in ("ray", "ray[default]", "ray==", "==2.59"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_pin(wrong)
    url = "ray @ https://example.org/ray-2.59.0-py3-none-any.whl"  # a URL is a version to try too
    assert overrides(["ray[tune]>=2.60,<2.61"], [parse_pin(url)]) == [url.replace("ray", "ray[tune]", 1)]
    requirements, locked = installed_requirements(PROJECT, "dev"), {"ray": "2.60.0", "grpcio": "1.85.3"}

    def check(*pins: str) -> str | None:
        return check_pins([parse_pin(pin) for pin in pins], requirements, locked, "detsweep")

    assert check("ray==2.59.*", "grpcio==1.80.*", "configspace==1.1.*") is None
    assert check("ray==2.59.*", "Ray>=2.58") == "ray is pinned more than once"
    assert check("DetSweep==0.0.1") == "detsweep is the project itself"
    assert "not a package detsweep installs" in check("torch==2.9.*")


def test_the_lines_name_the_pins_and_list_them_first():
    assert tried([]) == "the newest versions"
    pins = [parse_pin("ray==2.59.*"), parse_pin("NumPy==2.3.*")]
    assert tried(pins) == "ray==2.59.*, NumPy==2.3.* and uv.lock's other versions"
    assert tried(pins, constrained=False) == "ray==2.59.*, NumPy==2.3.* and the newest other versions"
    assert pinned_first(pins, watched=["ray", "tensorflow", "numpy"]) == ["ray", "numpy", "tensorflow"]
    assert pinned_first([], watched=["ray", "Keras_Hub"]) == ["ray", "keras-hub"]


class FakeUv:
    """uv, replaced: records each command and fails the first ``fail`` ``pip install``s."""

    def __init__(self, fail: int = 0):
        self.commands: list[list[str]] = []
        self.fail = fail

    def __call__(self, *args: str, log: Path) -> subprocess.CompletedProcess:
        self.commands.append(list(args))
        failed = args[:2] == ("pip", "install") and self.fail > 0
        self.fail -= failed
        stderr = "  ╰─▶ Because ray==2.59.0 depends on grpcio<1.80 and you require grpcio==1.85.3, …\n" if failed else ""
        return subprocess.CompletedProcess(args, 1 if failed else 0, "", stderr)

    def installs(self) -> list[list[str]]:
        return [command for command in self.commands if command[:2] == ["pip", "install"]]


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(upgrade_check, "SCRATCH", tmp_path)
    return tmp_path


def test_without_a_pin_everything_is_upgraded_unconstrained(scratch: Path, monkeypatch: pytest.MonkeyPatch):
    fake = FakeUv()
    monkeypatch.setattr(upgrade_check, "uv", fake)
    assert install(PROJECT, LOCK, []) == (None, False)
    [command] = fake.installs()
    assert "--upgrade" in command and "--constraints" not in command
    assert not (scratch / "constraints.txt").exists()
    assert "ray[default,train,tune]>=2.60\n" in (scratch / "overrides.txt").read_text()


def test_a_pin_installs_with_uv_locks_other_versions_as_constraints(scratch: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture):
    fake = FakeUv()
    monkeypatch.setattr(upgrade_check, "uv", fake)
    assert install(PROJECT, LOCK, [parse_pin("ray==2.59.*")]) == (None, True)
    [command] = fake.installs()
    assert "--upgrade" not in command
    assert command[command.index("--constraints") + 1] == str(scratch / "constraints.txt")
    assert (scratch / "constraints.txt").read_text() == "grpcio==1.85.3\nkeras-hub==0.32.0\nnumpy==2.4.6\n"
    assert (scratch / "overrides.txt").read_text().splitlines()[0] == "ray[default,train,tune]==2.59.*"
    out = capsys.readouterr().out
    assert "upgrade-check: pinned: ray[default,train,tune]==2.59.*\n" in out
    assert "lifted: protobuf>=7.36," in out


def test_a_pin_that_does_not_install_with_uv_locks_versions_is_tried_without_them(
        scratch: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    fake = FakeUv(fail=1)
    monkeypatch.setattr(upgrade_check, "uv", fake)
    assert install(PROJECT, LOCK, [parse_pin("ray==2.59.*")]) == (None, False)
    first, second = fake.installs()
    assert "--constraints" in first and "--constraints" not in second and "--upgrade" not in second
    assert [command[0] for command in fake.commands] == ["venv", "pip", "venv", "pip"]  # a new environment each time
    said = [line for line in capsys.readouterr().out.splitlines() if "did not install" in line]
    assert said == ["upgrade-check: ray==2.59.* did not install with uv.lock's other versions (Because ray==2.59.0 "
                    "depends on grpcio<1.80 and you require grpcio==1.85.3, …); trying again without them: the other "
                    "packages get the newest versions that install with the pins"]
    fake = FakeUv(fail=2)
    monkeypatch.setattr(upgrade_check, "uv", fake)
    assert install(PROJECT, LOCK, [parse_pin("ray==2.59.*")]) == (
        "Because ray==2.59.0 depends on grpcio<1.80 and you require grpcio==1.85.3, …", False)


def test_a_package_below_its_newest_release_is_named_with_uvs_reason(scratch: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture):
    """Without a pin, the newest of each required package is asked for alone (``uv pip compile
    --no-deps``); one installed below it gets a line: uv's cause when the two cannot install
    together (as MLflow 3.18 while its mlflow-tracing was not served), else what moves with it
    (as MLflow 3.18 beside cryptography 51, which it excludes)."""
    calls, overridden = [], {}

    def fake(*args: str, log: Path) -> subprocess.CompletedProcess:
        calls.append(args)
        if args[:2] == ("pip", "compile"):
            return subprocess.CompletedProcess(args, 0, "mlflow==3.18.0\nray[train]==2.60.0\noptuna==5.1.0\n", "")
        lines = Path(args[args.index("--overrides") + 1]).read_text().splitlines()
        wanted = args[-1] if "==" in args[-1] else next(line for line in lines if "==" in line)  # asked, or pinned
        overridden[wanted] = lines
        if wanted == "mlflow[auth]==3.18.0":
            return subprocess.CompletedProcess(args, 1, "", (
                "Using Python 3.11.7 environment at: env\nerror: No solution found when resolving dependencies\n"
                "  cause: Because there is no version of mlflow-tracing==3.18.0 and mlflow>=3.18.0 depends on "
                "mlflow-tracing==3.18.0, we can conclude that mlflow>=3.18.0 cannot be used.\n"
                "         And because detsweep==0.1.0 depends on mlflow[auth]==3.18.0, … unsatisfiable.\n"))
        return subprocess.CompletedProcess(args, 0, "", "Would install 3 packages\n - cryptography==51.0.1\n"
                                           " + cryptography==50.0.2\n - detsweep==0.1.0 (from file:///repo)\n"
                                           " + detsweep==0.1.0 (from file:///repo)\n - optuna==5.0.0\n + optuna==5.1.0\n"
                                           " - alembic==1.18.0\n + alembic==1.18.2\n")  # up with it: no reason

    monkeypatch.setattr(upgrade_check, "uv", fake)
    project = PROJECT | {"dependencies": [*PROJECT["dependencies"], "mlflow[auth]>=3.17,<3.18"]}
    upgrade_check.report_held_back(project, {"mlflow": "3.17.2", "ray": "2.60.0", "optuna": "5.0.0", "numpy": "2.4.6"})
    said = capsys.readouterr().out.splitlines()
    assert said == [
        "upgrade-check: not the newest: mlflow 3.17.2 installed, 3.18.0 served: Because there is no version of "
        "mlflow-tracing==3.18.0 and mlflow>=3.18.0 depends on mlflow-tracing==3.18.0, we can conclude that "
        "mlflow>=3.18.0 cannot be used.",
        "upgrade-check: not the newest: optuna 5.0.0 installed, 5.1.0 served: it installs only with "
        "cryptography 50.0.2 (not 51.0.1)"]
    asked = (scratch / "newest.in").read_text().splitlines()
    assert {"mlflow", "ray", "optuna", "numpy", "mlflow-skinny"} <= set(asked) and "detsweep" not in asked
    assert list(overridden) == ["mlflow[auth]==3.18.0", "optuna==5.1.0"]
    assert all("--dry-run" in call for call in calls if call[:2] == ("pip", "install"))
    # Required by detsweep: its override pinned, as --pin does (an override binds the command line's
    # requirement too). Not required by detsweep: asked for beside the rest, whose requirements still bind.
    assert not [line for line in overridden["mlflow[auth]==3.18.0"] if line.startswith("mlflow[auth]>")]
    assert not [line for line in overridden["optuna==5.1.0"] if line.startswith("optuna")]


def test_uvs_cause_is_the_sentence_naming_a_release_the_registry_does_not_serve():
    """uv derives a failed resolution in chains of sentences; the line keeps the root: what is not
    served (not the project's own 'only detsweep[dev]==0.1.0 is available'), else the first."""
    derivation = (
        "error: No solution found when resolving dependencies\n"
        "  cause: Because mlflow==3.17.0 depends on mlflow-skinny==3.17.0 and mlflow==3.17.1 depends on "
        "mlflow-skinny==3.17.1, we can conclude that mlflow>=3.17.0,<=3.17.1 depends on mlflow-skinny>=3.17.0,<=3.17.1. (1)\n"
        "\n"
        "         Because there is no version of mlflow-tracing==3.18.0 and mlflow>=3.18.0 depends on "
        "mlflow-tracing==3.18.0, we can conclude that mlflow>=3.18.0 cannot be used.\n"
        "         And because only detsweep[dev]==0.1.0 is available and you require detsweep[dev], we can conclude "
        "that your requirements are unsatisfiable.\n")
    assert upgrade_check.cause(derivation) == (
        "Because there is no version of mlflow-tracing==3.18.0 and mlflow>=3.18.0 depends on mlflow-tracing==3.18.0, "
        "we can conclude that mlflow>=3.18.0 cannot be used.")
    assert upgrade_check.cause("  cause: Because a==1 depends on b<2 and you require b==3, no.\n") == (
        "Because a==1 depends on b<2 and you require b==3, no.")
    assert upgrade_check.cause("error: the index answered 503\n") == "error: the index answered 503"


def test_a_registry_that_does_not_say_what_it_serves_is_said_so_not_taken_for_newest(
        scratch: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    def unanswered(*args: str, log: Path) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(args, 2, "", "error: Failed to fetch: `https://index/simple/ray/`\n")

    monkeypatch.setattr(upgrade_check, "uv", unanswered)
    upgrade_check.report_held_back(PROJECT, {"ray": "2.60.0"})
    assert capsys.readouterr().out.splitlines() == [
        "upgrade-check: could not ask which releases are the newest: error: Failed to fetch: `https://index/simple/ray/`"]
