"""``make upgrade-check``: would detsweep still work on the newest versions the registry serves?

It installs detsweep (``-e '.[dev]'``) into a scratch environment, ``.venv/upgrade-check/env``,
with the upper bounds of pyproject.toml's requirements lifted (``ray<2.61`` and the like, which
``make demo`` and ``make test`` keep through uv.lock), then runs there the tests marked
``upgrade_check``: the adapters' tests and one short sweep with MLflow tracking, a fine-tune
and an export. The install keeps nothing outside ``.venv/upgrade-check`` (uv keeps no cache),
and the repo's own environment is left as uv.lock made it. "Newest" is what uv resolves: no
pre-releases, and a release that cannot be installed with the rest (an ``mlflow`` whose
``mlflow-tracing`` is not served yet) is passed over for the newest one that can: a line says
so for each package detsweep requires or leans on, with uv's reason.

``--pin REQUIREMENT`` (repeatable; ``make upgrade-check PIN='ray==2.59.*'`` passes one) tries a
chosen version instead of the newest: ``python tools/upgrade_check.py --pin 'ray==2.59.*'``
(quoted: the shell would expand the ``*``). The pin replaces that package's requirement, matched
by its canonical name, in the overrides, keeping the extras and marker pyproject.toml gives it
(``ray[default,train,tune]==2.59.*`` for ``ray[default,train,tune]>=2.58,<2.61``); a package
detsweep only installs through another's requirements can be pinned too (the pin then replaces
every requirement on it), one that uv.lock does not hold either cannot. Every other package keeps
uv.lock's version: nothing is upgraded, and uv.lock's versions of all but the pinned packages are
installed as constraints (``constraints.txt``), so that only the pins move. When the pinned
version requires something else than uv.lock holds, that fails; the install is then tried again
without the constraints, saying so in one line, and the other packages get the newest versions
that install with the pins (the table shows which moved).

How to read what it prints, every line starting ``upgrade-check:``:

- with ``--pin``, a line with the pinned requirements, and one more if uv.lock's other versions
  did not install with them;
- a table of the packages whose version differs from uv.lock's (``-`` in the uv.lock column: a
  package uv.lock does not have), the pinned and then the ones detsweep leans on first, its title
  naming the pins, then a line naming those of them that did not change;
- without ``--pin``, a line
  ``not the newest: <package> <installed> installed, <newest> served: <why>`` for each package
  pyproject.toml requires (or ``WATCHED``) that is below the newest release the registry serves
  (``uv pip compile --no-deps`` asks for it alone), why being the sentence of uv's cause that
  names what the registry does not serve when the two cannot be installed together (``there is
  no version of mlflow-tracing==3.18.0``), else which other packages would go down with it
  (``cryptography 50.0.2 (not 51.0.1)``: the resolution preferred their newer releases); or one
  line saying that every one is the newest (or that the registry did not answer);
- ``FAILED <test>: <its error>`` for each test that failed (``ERROR`` when its set-up did, as
  pytest says), the error being the last ``SomethingError: …`` line of pytest's report (the
  tests put a subprocess's stderr into their assertions, whose first line is mostly a warning),
  else its message's first line; or one ``FAILED install: …`` line with uv's cause when
  the newest (or the pinned) versions could not be installed together;
- a closing line with the counts, the versions tried (the pins, and whether the other packages
  were at uv.lock's or the newest versions) and the logs to read (``install.log``, ``tests.log``).

The exit code is 1 when anything failed, 0 otherwise (2 for a ``--pin`` it cannot try). Only the
standard library and ``packaging`` are used: the repo's venv runs it, before anything else is
installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import Specifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

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


def overrides(requirements: list[str], pins: Sequence[Requirement] = ()) -> list[str]:
    """The lifted form of each requirement that has a bound to lift. The others stay out: an
    override replaces every package's requirement on that name, so overriding ``protobuf>=4.25``
    would also drop TensorFlow's own upper bound on protobuf, and report as broken a version
    no release of TensorFlow accepts. A pinned package's requirements are replaced by its pin
    (``pinned``), in the place of the first, or at the end when no requirement names it."""
    pinned = {canonicalize_name(pin.name): pin for pin in pins}
    lines, placed = [], set()
    for requirement in requirements:
        name = canonicalize_name(Requirement(requirement).name)
        if name in pinned:
            if name not in placed:
                lines.append(pin_requirement(pinned[name], requirements))
                placed.add(name)
        elif (lifted := lift_upper_bounds(requirement)) != str(Requirement(requirement)):
            lines.append(lifted)
    return lines + [pin_requirement(pin, requirements) for name, pin in pinned.items() if name not in placed]


def pin_requirement(pin: Requirement, requirements: list[str]) -> str:
    """``pin`` with the extras of ``requirements``' on the same package (matched by canonical
    name) added to its own, and their marker when it has none: what replaces them."""
    name = canonicalize_name(pin.name)
    same = [parsed for parsed in map(Requirement, requirements) if canonicalize_name(parsed.name) == name]
    replacement = Requirement(str(pin))
    replacement.extras = set(pin.extras).union(*(parsed.extras for parsed in same))
    if replacement.marker is None and same:
        replacement.marker = same[0].marker
    return str(replacement)


def parse_pin(text: str) -> Requirement:
    """A ``--pin``: a requirement with a version (``ray==2.59.*``) or a URL."""
    try:
        pin = Requirement(text)
    except InvalidRequirement as error:
        raise argparse.ArgumentTypeError(f"not a requirement: {text!r} ({error})") from None
    if not pin.specifier and not pin.url:
        raise argparse.ArgumentTypeError(f"{text!r} names no version to try (like 'ray==2.59.*')")
    return pin


def check_pins(pins: list[Requirement], requirements: list[str], locked: dict[str, str], project: str) -> str | None:
    """What is wrong with ``pins``, or None: a package pinned twice, the project itself, or one
    that neither a requirement nor uv.lock names (an override on it would be silently unused)."""
    names = [canonicalize_name(pin.name) for pin in pins]
    known = {canonicalize_name(Requirement(requirement).name) for requirement in requirements} | set(locked)
    for name in names:
        if names.count(name) > 1:
            return f"{name} is pinned more than once"
        if name == canonicalize_name(project):
            return f"{name} is the project itself"
        if name not in known:
            return f"{name} is not a package detsweep installs (not in pyproject.toml's requirements nor uv.lock)"
    return None


def lock_constraints(lock: dict, leave_out: list[str], project: str) -> list[str]:
    """``name==version`` for each package of a parsed uv.lock but the project and the ``leave_out``
    ones (the pinned: they may move), sorted; a package uv.lock holds at several versions (one per
    platform) is left out too, as no one version can constrain it."""
    versions: dict[str, set[str]] = {}
    for package in lock.get("package", []):
        if "version" in package:
            versions.setdefault(canonicalize_name(package["name"]), set()).add(package["version"])
    skip = {canonicalize_name(name) for name in [*leave_out, project]}
    return [f"{name}=={next(iter(found))}" for name, found in sorted(versions.items())
            if name not in skip and len(found) == 1]


def pinned_first(pins: Sequence[Requirement], watched: list[str] = WATCHED) -> list[str]:
    """The pinned packages, then the ``watched`` ones that are not pinned: the table's order."""
    return list(dict.fromkeys(canonicalize_name(name) for name in [*(pin.name for pin in pins), *watched]))


def tried(pins: list[Requirement], constrained: bool = True) -> str:
    """The versions a run tried, for its lines: ``the newest versions``, or the pins and whether
    the rest were uv.lock's versions or the newest that install with them."""
    if not pins:
        return "the newest versions"
    rest = "uv.lock's" if constrained else "the newest"
    return f"{', '.join(map(str, pins))} and {rest} other versions"


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
    env = {**os.environ, "TMPDIR": str(temporary)}
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


def install(project: dict, lock: dict, pins: list[Requirement]) -> tuple[str | None, bool]:
    """A new scratch environment with detsweep and the newest versions its lifted requirements
    allow, or with ``pins`` and uv.lock's versions of the rest (without them when they do not
    install together). None, or uv's cause when it could not; and whether uv.lock's versions
    constrained the rest."""
    log = SCRATCH / "install.log"
    log.write_text("")
    requirements = installed_requirements(project, EXTRA)
    lines = overrides(requirements, pins)
    (SCRATCH / "overrides.txt").write_text("".join(f"{line}\n" for line in lines))
    pinned = {canonicalize_name(pin.name) for pin in pins}
    say(f"lifted: {', '.join(line for line in lines if canonicalize_name(Requirement(line).name) not in pinned) or 'nothing'}")
    constraints = SCRATCH / "constraints.txt"
    constraints.unlink(missing_ok=True)
    if not pins:
        return install_with(log, "--upgrade"), False
    say(f"pinned: {', '.join(line for line in lines if canonicalize_name(Requirement(line).name) in pinned)}")
    constraints.write_text("".join(f"{line}\n" for line in lock_constraints(lock, list(pinned), project["name"])))
    broken = install_with(log, "--constraints", str(constraints))
    if not broken:
        return None, True
    say(f"{', '.join(map(str, pins))} did not install with uv.lock's other versions ({broken}); trying again "
        f"without them: the other packages get the newest versions that install with the pins")
    return install_with(log), False


def install_with(log: Path, *options: str) -> str | None:
    """detsweep ``-e '.[dev]'`` with overrides.txt and ``options`` into a new scratch environment;
    None, or uv's cause when it could not."""
    made = uv("venv", "--clear", "--python", str(VENV / "bin" / "python"), str(ENV), log=log)
    if made.returncode != 0:
        return last_line(made.stderr)
    # Bytecode as make test has it: Python may not write its own here, and every trial's
    # process would compile TensorFlow again.
    installed = uv("pip", "install", *options, "--compile-bytecode", "--python", str(PYTHON),
                   "--overrides", str(SCRATCH / "overrides.txt"), "-e", f".[{EXTRA}]", log=log)
    return None if installed.returncode == 0 else cause(installed.stderr)


# -- what was held back -------------------------------------------------------------------------


def newest_served(names: list[str]) -> dict[str, str]:
    """The newest release the registry serves of each package, on its own (``uv pip compile
    --no-deps``: nothing else it requires is asked for): canonical name → version."""
    wanted = SCRATCH / "newest.in"
    wanted.write_text("".join(f"{name}\n" for name in names))
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = uv("pip", "compile", str(wanted), "--no-deps", "--no-header", "--no-annotate", "--python-version", python,
               log=SCRATCH / "install.log")
    if found.returncode != 0:
        raise RegistryUnanswered(cause(found.stderr))
    return pinned_versions(found.stdout)


class RegistryUnanswered(RuntimeError):
    """The registry did not say which releases it serves."""


def pinned_versions(text: str) -> dict[str, str]:
    """``name==version`` lines (a requirements file) as canonical name → version."""
    versions = {}
    for line in text.splitlines():
        name, equals, version = line.split("#")[0].strip().partition("==")
        if equals:
            versions[canonicalize_name(name.split("[")[0])] = version.strip()
    return versions


def held_back(installed: dict[str, str], newest: dict[str, str]) -> list[tuple[str, str, str]]:
    """(package, installed version, newest release) for each package installed below its newest."""
    return [(name, installed[name], version) for name, version in sorted(newest.items())
            if name in installed and Version(installed[name]) < Version(version)]


def why_held_back(project: dict, requirements: list[str], name: str, version: str) -> str:
    """Why uv did not install ``name==version`` with the rest, asked by a dry run that requires
    it (a package pyproject.toml requires is pinned in its override, as ``--pin`` does; another
    is required beside the rest, so that what requires it still decides): uv's cause when it
    cannot install, else what would move with it (the versions uv preferred)."""
    pin = Requirement(f"{name}=={version}")
    direct = name in {canonicalize_name(Requirement(requirement).name) for requirement in requirements}
    tried_overrides = SCRATCH / "overrides-held-back.txt"
    tried_overrides.write_text("".join(f"{line}\n" for line in overrides(requirements, [pin] if direct else [])))
    tried = uv("pip", "install", "--dry-run", "--python", str(PYTHON), "--overrides", str(tried_overrides),
               "-e", f".[{EXTRA}]", *([] if direct else [str(pin)]), log=SCRATCH / "install.log")
    if tried.returncode != 0:
        return cause(tried.stderr, project["name"])
    moves = dry_run_moves(tried.stdout + tried.stderr)
    skip = {name, canonicalize_name(project["name"])}
    # Only what would go down explains the choice: what goes up with it is a consequence.
    others = [f"{other} {new} (not {old})" for other, (old, new) in moves.items()
              if other not in skip and old and new and Version(new) < Version(old)]
    return f"it installs only with {', '.join(others)}" if others else "it installs with the rest: uv preferred another"


MISSING = re.compile(r"there is no version of|only \S+ is available")


def cause(uv_error: str, project: str = "detsweep") -> str:
    """Why uv found no solution, in one line: the sentences of its ``cause:`` block that name a
    release the registry does not serve (the root of the derivation), else the block's first
    sentence; uv's last line when it gave no cause. install.log keeps its whole answer."""
    lines = [line.strip().removeprefix("╰─▶").strip() for line in uv_error.splitlines()]
    start = next((place for place, line in enumerate(lines) if line.startswith(("cause:", "Because"))), None)
    if start is None:
        return last_line(uv_error)
    block = []
    for line in lines[start:]:
        if line.startswith("hint:"):
            break
        block.append(line)
    text = " ".join(line for line in block if line).removeprefix("cause:").strip()
    sentences = [sentence.strip() for sentence in re.split(r"(?<=[.)]) (?=And because|Because)", text)]
    missing = [sentence for sentence in sentences if MISSING.search(sentence) and project not in sentence]
    return " ".join(missing or sentences[:1])


def dry_run_moves(output: str) -> dict[str, tuple[str | None, str | None]]:
    """What ``uv pip install --dry-run`` would change: package → (version removed, version added)."""
    moves: dict[str, list[str | None]] = {}
    for line in output.splitlines():
        sign, _, requirement = line.strip().partition(" ")
        name, equals, version = requirement.partition("==")
        if sign in ("-", "+") and equals:
            moves.setdefault(canonicalize_name(name), [None, None])[sign == "+"] = version.split()[0]
    return {name: (old, new) for name, (old, new) in moves.items()}


def report_held_back(project: dict, installed: dict[str, str]) -> None:
    """A line for each package detsweep requires (or leans on: WATCHED) that was installed
    below the newest release the registry serves, with why."""
    requirements = installed_requirements(project, EXTRA)
    names = sorted({canonicalize_name(Requirement(r).name) for r in requirements}
                   | {canonicalize_name(name) for name in WATCHED})
    names = [name for name in names if name != canonicalize_name(project["name"])]
    try:
        behind = held_back(installed, newest_served(names))
    except RegistryUnanswered as error:
        say(f"could not ask which releases are the newest: {error}")
        return
    if not behind:
        say(f"every one of the {len(names)} packages detsweep requires or leans on is at its newest release")
    for name, version, newest in behind:
        say(f"not the newest: {name} {version} installed, {newest} served: {why_held_back(project, requirements, name, newest)}")


def installed_versions() -> dict[str, str]:
    listed = uv("pip", "list", "--format", "json", "--python", str(PYTHON), log=SCRATCH / "install.log")
    return {package["name"]: package["version"] for package in json.loads(listed.stdout)}


def report_versions(lock: dict, project: str, pins: list[Requirement]) -> dict[str, str]:
    """The table of what moved from uv.lock; returns the installed versions by canonical name."""
    locked = locked_versions(lock)
    installed = {canonicalize_name(name): version for name, version in installed_versions().items()}
    installed.pop(canonicalize_name(project), None)
    # The pinned packages first, in the table or the unchanged line: what was tried.
    watched = pinned_first(pins)
    rows = version_changes(locked, installed, watched)
    pinned = f" with {', '.join(map(str, pins))}" if pins else ""
    say(f"versions that differ from uv.lock{pinned} ({len(rows)}):" if rows
        else f"every package is at uv.lock's version{pinned}")
    for line in table(rows) if rows else []:
        say(f"  {line}")
    same = unchanged_watched(locked, installed, watched)
    if same:
        say(f"unchanged: {', '.join(same)}")
    return installed


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


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tools/upgrade_check.py", description="Run the upgrade_check tests on the newest versions, "
        "bounds lifted, or on pinned versions with uv.lock's for the rest (the module's docstring says more).")
    parser.add_argument("--pin", action="append", default=[], type=parse_pin, metavar="REQUIREMENT",
                        help="try this version instead of the newest, the other packages at uv.lock's versions, "
                        "e.g. --pin 'ray==2.59.*' (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    pins = arguments(argv).pin
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    wrong = check_pins(pins, installed_requirements(project, EXTRA), locked_versions(lock), project["name"])
    if wrong:
        say(f"--pin: {wrong}")
        return 2
    SCRATCH.mkdir(parents=True, exist_ok=True)
    say(f"installing {tried(pins)} into {ENV.relative_to(REPO)} (log: {SCRATCH / 'install.log'})")
    broken, constrained = install(project, lock, pins)
    if broken:
        say(f"FAILED install: {broken}")
        say(f"1 failed: {tried(pins, constrained)} could not be installed (log: {SCRATCH / 'install.log'})")
        return 1
    installed = report_versions(lock, project["name"], pins)
    if not pins:  # the newest were asked for: say which were not had, and why
        report_held_back(project, installed)
    lines, numbers = run_marked_tests()
    for line in lines:
        say(line)
    if numbers:
        passed = numbers["tests"] - numbers["failures"] - numbers["errors"] - numbers["skipped"]
        summary = f"{numbers['failures'] + numbers['errors']} failed, {passed} passed, {numbers['skipped']} skipped"
    else:
        summary = f"{len(lines)} failed"
    verdict = "something broke" if lines else "nothing broke"
    say(f"{summary}: {verdict} on {tried(pins, constrained)} (log: {SCRATCH / 'tests.log'})")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
