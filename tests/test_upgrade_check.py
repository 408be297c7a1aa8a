"""``make upgrade-check``'s parts that decide (tools/upgrade_check.py), on small inputs: which
bounds it lifts, which versions it reports as changed, which tests it reports as broken. No
install: the real run is ``make upgrade-check`` itself."""

from __future__ import annotations

from pathlib import Path

from tools.upgrade_check import (
    failures,
    installed_requirements,
    lift_upper_bounds,
    marked_test_files,
    overrides,
    table,
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
