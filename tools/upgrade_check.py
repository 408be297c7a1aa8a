"""``make upgrade-check``: would detsweep still work on the newest versions the registry serves?

It installs detsweep (``-e '.[dev]'``) into a scratch environment, ``.venv/upgrade-check/env``,
with the upper bounds of pyproject.toml's requirements lifted (``ray<2.61`` and the like, which
``make demo`` and ``make test`` keep through uv.lock), then runs there the tests marked
``upgrade_check``: the adapters' tests and one short sweep with MLflow tracking, a fine-tune
and an export. The install keeps nothing outside ``.venv/upgrade-check`` (uv keeps no cache),
and the repo's own environment is left as uv.lock made it. "Newest" is what uv resolves: no
pre-releases, and a release that cannot be installed with the rest (an ``mlflow`` whose
``mlflow-skinny`` is not served yet) is passed over for the newest one that can, unreported.

How to read what it prints, every line starting ``upgrade-check:``:

- a table of the packages whose version differs from uv.lock's (``-`` in the uv.lock column: a
  package uv.lock does not have), the ones detsweep leans on first, then a line naming those of
  them that did not change;
- ``FAILED <test>: <its error>`` for each test that failed (``ERROR`` when its set-up did, as
  pytest says), the error being the last ``SomethingError: …`` line of pytest's report (the
  tests put a subprocess's stderr into their assertions, whose first line is mostly a warning),
  else its message's first line; or one ``FAILED install: …`` line with uv's last line when
  the newest versions could not be installed together;
- a closing line with the counts and the logs to read (``install.log``, ``tests.log``).

The exit code is 1 when anything failed, 0 otherwise. Only the standard library and
``packaging`` are used: the repo's venv runs it, before anything else is installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import Specifier, SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv"
UV = VENV / "bin" / "uv"
SCRATCH = VENV / "upgrade-check"
ENV = SCRATCH / "env"
PYTHON = ENV / "bin" / "python"
EXTRA = "dev"  # what make test installs
MARK = "upgrade_check"
# The packages detsweep leans on most; listed first, and named even when they did not change.
WATCHED = ["ray", "tensorflow", "keras", "keras-hub", "mlflow", "mlflow-skinny", "optuna", "numpy", "protobuf"]


def say(line: str) -> None:
    print(f"upgrade-check: {line}", flush=True)


# -- what to install ---------------------------------------------------------------------------


def lift_upper_bounds(requirement: str) -> str:
    """``requirement`` with its upper bounds dropped and its pins turned into lower bounds
    (``==1.2`` and ``~=1.2`` to ``>=1.2``); its extras, lower bounds, exclusions and marker kept."""
    parsed = Requirement(requirement)
    kept = []
    for spec in parsed.specifier:
        if spec.operator in ("<", "<="):
            continue
        if spec.operator in ("==", "===", "~="):
            spec = Specifier(f">={spec.version.removesuffix('.*')}")
        kept.append(spec)
    parsed.specifier = SpecifierSet(",".join(str(spec) for spec in kept))
    return str(parsed)


def installed_requirements(project: dict, extra: str) -> list[str]:
    """The requirements that ``pip install '.[extra]'`` takes from ``[project]``: its
    dependencies and the extra's, following the extra's references to the project's own
    extras (``detsweep[bohb]``) instead of listing them."""
    name = canonicalize_name(project["name"])
    optional = project.get("optional-dependencies", {})
    found, seen, todo = list(project.get("dependencies", [])), set(), [extra]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for requirement in optional.get(current, []):
            if canonicalize_name(Requirement(requirement).name) == name:
                todo.extend(Requirement(requirement).extras)
            else:
                found.append(requirement)
    return found


def overrides(requirements: list[str]) -> list[str]:
    """The lifted form of each requirement that has a bound to lift. The others stay out: an
    override replaces every package's requirement on that name, so overriding ``protobuf>=4.25``
    would also drop TensorFlow's own upper bound on protobuf, and report as broken a version
    no release of TensorFlow accepts."""
    return [lifted for requirement in requirements if (lifted := lift_upper_bounds(requirement)) != str(Requirement(requirement))]


# -- what changed ------------------------------------------------------------------------------


def locked_versions(lock: dict) -> dict[str, str]:
    """Each package of a parsed uv.lock and its version (the project itself has none there)."""
    return {canonicalize_name(package["name"]): package["version"] for package in lock.get("package", [])
            if "version" in package}


def version_changes(locked: dict[str, str], installed: dict[str, str],
                    watched: list[str] = WATCHED) -> list[tuple[str, str | None, str]]:
    """(package, uv.lock's version or None, installed version) for each installed package whose
    version is not uv.lock's: ``watched`` ones first, in that order, then the rest by name.
    Packages of uv.lock that are not installed are left out: uv.lock also holds every extra's
    (the gpu extra's CUDA libraries), which the scratch environment never installs."""
    locked = {canonicalize_name(name): version for name, version in locked.items()}
    installed = {canonicalize_name(name): version for name, version in installed.items()}
    order = {canonicalize_name(name): place for place, name in enumerate(watched)}
    changed = [name for name, version in installed.items() if locked.get(name) != version]
    changed.sort(key=lambda name: (order.get(name, len(order)), name))
    return [(name, locked.get(name), installed[name]) for name in changed]


def unchanged_watched(locked: dict[str, str], installed: dict[str, str], watched: list[str] = WATCHED) -> list[str]:
    """``name version`` for each watched package installed at uv.lock's version."""
    return [f"{name} {installed[name]}" for name in map(canonicalize_name, watched)
            if name in installed and locked.get(name) == installed[name]]


def table(rows: list[tuple[str, str | None, str]]) -> list[str]:
    header = ("package", "uv.lock", "now")
    cells = [header] + [(name, old or "-", new) for name, old, new in rows]
    widths = [max(len(row[column]) for row in cells) for column in range(3)]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]


# -- what broke --------------------------------------------------------------------------------


def marked_test_files(tests: Path, mark: str = MARK) -> list[Path]:
    """The test files that carry ``mark`` on a test or module-wide: only those are collected,
    so that an unrelated module's import does not count against the newest versions."""
    pattern = re.compile(rf"^\s*(@pytest\.mark\.{mark}\b|pytestmark\b.*\bpytest\.mark\.{mark}\b)", re.MULTILINE)
    return sorted(path for path in tests.glob("test_*.py") if pattern.search(path.read_text()))


def failures(junit_xml: str) -> list[str]:
    """``FAILED <nodeid>: <its error>`` (``ERROR`` for a failed set-up or collection) for each
    such test of a pytest ``--junitxml`` report written with ``junit_family=xunit1``, whose
    ``file`` attribute gives back the node id."""
    lines = []
    for case in ET.fromstring(junit_xml).iter("testcase"):
        for kind, word in (("failure", "FAILED"), ("error", "ERROR")):
            for problem in case.findall(kind):
                lines.append(f"{word} {node_id(case)}: {what_broke(problem.get('message') or '', problem.text or '')}")
    return lines


ERROR_LINE = re.compile(r"^E\s+((?:\w+\.)*\w*(?:Error|Exception): .+)$")


def what_broke(message: str, report: str) -> str:
    """The last ``SomethingError: …`` line of a failure's report (pytest's ``E`` lines; the
    message alone is cut after a few lines), else the message's first line."""
    errors = [found.group(1).strip() for line in report.splitlines() if (found := ERROR_LINE.match(line))]
    lines = message.strip().splitlines()
    return errors[-1] if errors else lines[0] if lines else "(no message)"


def node_id(case: ET.Element) -> str:
    """A junit test case's pytest node id: ``tests/test_x.py::Class::test``."""
    file, classname, name = case.get("file"), case.get("classname", ""), case.get("name", "")
    if not file:  # a collection error: its name is the module's
        return name
    module = file.removesuffix(".py").replace("/", ".")
    inner = classname.removeprefix(module).strip(".")
    return "::".join([file, *(inner.split(".") if inner else []), name])


def counts(junit_xml: str) -> dict[str, int]:
    suite = ET.fromstring(junit_xml)
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    return {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}


# -- running it --------------------------------------------------------------------------------


def uv(*args: str, log: Path) -> subprocess.CompletedProcess:
    """``uv args`` with its output appended to ``log``. It keeps no cache (``--no-cache``), and
    the temporary folder it uses instead lies under SCRATCH, like everything else of this run."""
    temporary = SCRATCH / "tmp"
    temporary.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "UV_CACHE_DIR": str(VENV / ".uv-cache"), "TMPDIR": str(temporary)}
    try:
        result = subprocess.run([str(UV), *args, "--no-cache"], cwd=REPO, env=env, capture_output=True, text=True)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    with log.open("a") as out:
        out.write(f"$ uv {' '.join(args)}\n{result.stdout}{result.stderr}\n")
    return result


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def install_newest(project: dict) -> str | None:
    """A new scratch environment with detsweep and the newest versions its lifted requirements
    allow; None, or uv's last line when it could not."""
    log = SCRATCH / "install.log"
    log.write_text("")
    lifted = overrides(installed_requirements(project, EXTRA))
    (SCRATCH / "overrides.txt").write_text("".join(f"{line}\n" for line in lifted))
    say(f"lifted: {', '.join(lifted) or 'nothing'}")
    made = uv("venv", "--clear", "--python", str(VENV / "bin" / "python"), str(ENV), log=log)
    if made.returncode != 0:
        return last_line(made.stderr)
    # Bytecode as make test has it: Python may not write its own here, and every trial's
    # process would compile TensorFlow again.
    installed = uv("pip", "install", "--upgrade", "--compile-bytecode", "--python", str(PYTHON),
                   "--overrides", str(SCRATCH / "overrides.txt"), "-e", f".[{EXTRA}]", log=log)
    return None if installed.returncode == 0 else last_line(installed.stderr)


def installed_versions() -> dict[str, str]:
    listed = uv("pip", "list", "--format", "json", "--python", str(PYTHON), log=SCRATCH / "install.log")
    return {package["name"]: package["version"] for package in json.loads(listed.stdout)}


def report_versions() -> None:
    locked = locked_versions(tomllib.loads((REPO / "uv.lock").read_text()))
    installed = {canonicalize_name(name): version for name, version in installed_versions().items()}
    installed.pop(canonicalize_name(project_name()), None)
    rows = version_changes(locked, installed)
    say(f"versions that differ from uv.lock ({len(rows)}):" if rows else "every package is at uv.lock's version")
    for line in table(rows) if rows else []:
        say(f"  {line}")
    same = unchanged_watched(locked, installed)
    if same:
        say(f"unchanged: {', '.join(same)}")


def project_name() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]


def run_marked_tests() -> tuple[list[str], dict[str, int] | None]:
    """The failure lines of the marked tests run in the scratch environment, and pytest's counts
    (None when it wrote no report)."""
    files = marked_test_files(REPO / "tests")
    if not files:
        return [f"FAILED tests: no test file carries pytest.mark.{MARK}"], None
    log, report = SCRATCH / "tests.log", SCRATCH / "tests.xml"
    report.unlink(missing_ok=True)
    say(f"running the {MARK} tests of {', '.join(str(path.relative_to(REPO)) for path in files)} (log: {log})")
    # The scratch environment first on PATH, as if activated, for whatever a test starts by name.
    env = {**os.environ, "VIRTUAL_ENV": str(ENV), "PATH": f"{ENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = [str(PYTHON), "-m", "pytest", "-p", "no:randomly", "-m", MARK, "-rf",
               f"--junitxml={report}", "-o", "junit_family=xunit1", *(str(path.relative_to(REPO)) for path in files)]
    with log.open("w") as out:
        code = subprocess.run(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    if not report.is_file():
        return [f"FAILED pytest: exit code {code}, no report; its log ends: {last_line(log.read_text())}"], None
    xml = report.read_text()
    lines = failures(xml)
    if code == 5:  # pytest: no test selected
        lines.append(f"FAILED tests: -m {MARK} selected no test")
    elif code != 0 and not lines:
        lines.append(f"FAILED pytest: exit code {code}; its log ends: {last_line(log.read_text())}")
    return lines, counts(xml)


def main() -> int:
    SCRATCH.mkdir(parents=True, exist_ok=True)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    say(f"installing the newest versions into {ENV.relative_to(REPO)} (log: {SCRATCH / 'install.log'})")
    broken = install_newest(project)
    if broken:
        say(f"FAILED install: {broken}")
        say(f"1 failed: the newest versions could not be installed (log: {SCRATCH / 'install.log'})")
        return 1
    report_versions()
    lines, numbers = run_marked_tests()
    for line in lines:
        say(line)
    if numbers:
        passed = numbers["tests"] - numbers["failures"] - numbers["errors"] - numbers["skipped"]
        summary = f"{numbers['failures'] + numbers['errors']} failed, {passed} passed, {numbers['skipped']} skipped"
    else:
        summary = f"{len(lines)} failed"
    verdict = "something broke" if lines else "nothing broke"
    say(f"{summary}: {verdict} on the newest versions (log: {SCRATCH / 'tests.log'})")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
