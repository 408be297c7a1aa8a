"""`make bench-smoke`, here for the benchmarks whose path no other test takes: each script
runs end to end at a tiny size and records its table. This checks the scripts, not the
figures (benchmarks are never timed tests)."""

import json
import math
import os
import re
import sys

import pytest

from bench.common import Entry, render, throughputs

from .conftest import REPO, run_bounded

# What each benchmark of ``bench.run_all`` records, by its name there.
RECORDS = {"allocator": {"allocator"}, "input_pipeline": {"input_pipeline"}, "zoo_retinanet": {"zoo_retinanet"},
           "tracking_server": {"tracking_server"}, "data_memory": {"data_memory"},
           "evaluation_cost": {"evaluation_cost"}, "importance": {"importance"}}


# Benchmarks another test runs (and checks the record of) as its own fixture: not twice.
RUN_BY = {"int8_export": "tests/test_int8_export.py"}

# Benchmarks whose smoke run would only take a path these tests take on every run: a trial's
# start and resume, a sweep under FIFO and under halving (its rerun over seeds:
# tests/test_pareto_sweep.py), the loop with and without Ray Train and on two workers, two
# logical devices standing in for GPUs, a scheduler replayed on recorded curves, a tracking
# server restarted under a trial's writes, a sweep through the driver (large_sweep: only its
# stand-in training is its own, and a smoke run of it costs minutes). ``make bench-smoke``
# runs them; the suite does not pay for them twice.
PATH_TAKEN_BY = {"startup": "tests/test_sweep_runs.py", "early_stopping": "tests/test_sweep_runs.py",
                 "train_step": "tests/test_train.py", "scaling": "tests/test_train.py",
                 "scaling_gpu": "tests/test_train_step.py", "replay_settings": "tests/test_schedulers.py",
                 "replay_scale": "tests/test_schedulers.py", "large_sweep": "tests/test_sweep_runs.py",
                 "tracking_load": "tests/test_cluster_sweeps.py"}


def test_every_benchmark_is_smoked_here_or_takes_a_path_another_test_takes():
    from bench.run_all import BENCHMARKS

    assert set(BENCHMARKS) == set(RECORDS) | set(RUN_BY) | set(PATH_TAKEN_BY)
    assert not (set(RECORDS) & set(RUN_BY) or set(RECORDS) & set(PATH_TAKEN_BY) or set(RUN_BY) & set(PATH_TAKEN_BY))
    assert all((REPO / path).is_file() for path in [*RUN_BY.values(), *PATH_TAKEN_BY.values()])


@pytest.fixture(scope="module")
def smoked(tmp_path_factory) -> dict:
    """Each benchmark's smoke run, by name: its own process and results file, two at a time
    (each is mostly one core's Python; the machine has two), the longest first."""
    from .conftest import side_by_side

    def smoke(benchmark: str):
        out = tmp_path_factory.mktemp(benchmark) / "results.json"
        command = [sys.executable, "-m", "bench.run_all", "--smoke", "--only", benchmark, "--out", str(out)]
        return run_bounded(command, cwd=REPO), out

    names = ["tracking_server", "input_pipeline", "zoo_retinanet", "data_memory", "evaluation_cost", "importance",
             "allocator"]
    assert sorted(names) == sorted(RECORDS)
    return dict(zip(names, side_by_side([lambda name=name: smoke(name) for name in names])))


@pytest.mark.parametrize("benchmark", sorted(RECORDS))
def test_the_benchmark_runs_and_records_its_table(benchmark, smoked):
    """One test per benchmark: a failure names it."""
    result, out = smoked[benchmark]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results) == RECORDS[benchmark]
    for name, entry in results.items():
        header, *rows = entry["rows"]
        assert rows and all(len(row) == len(header) for row in rows), name
        figures = [value for row in rows for value in row[1:] if isinstance(value, (int, float))]
        assert figures and all(math.isfinite(value) and value >= 0 for value in figures), (name, rows)
        assert entry["machine"]["cores"] >= 1 and "tensorflow" in " ".join(entry["machine"]["versions"])
        for target in entry["targets"]:
            assert isinstance(target["met"], bool) and math.isfinite(target["measured"]), (name, target)
    markdown = out.with_suffix(".md").read_text()
    assert all(entry["title"] in markdown for entry in results.values())
    SPECIFIC.get(benchmark, lambda results: None)(results)


def allocator(results: dict) -> None:
    # one pair at the smoke's size: the ratio in the table is the pair's own
    [(pair, glibc, tcmalloc, ratio)] = results["allocator"]["rows"][1:]
    assert pair == 1 and ratio == tcmalloc / glibc == results["allocator"]["targets"][0]["measured"]


def tracking_server(results: dict) -> None:
    # both servers answered as detsweep's user, the shipped one with the credential cache
    rows = results["tracking_server"]["rows"][1:]
    assert [row[0] for row in rows] == ["MLflow's default (no credential cache)", "as shipped (credentials cached 60 s)"]


def data_memory(results: dict) -> None:
    # each size streamed, the first held whole too, and the estimate is the notes' sum
    rows = results["data_memory"]["rows"][1:]
    assert [row[2] for row in rows[:3]] == ["streamed", "in memory", "streamed"] and rows[0][0] < rows[2][0]
    assert results["data_memory"]["targets"][1]["what"] == "a GPU worker's host memory on COCO (estimate)"


def evaluation_cost(results: dict) -> None:
    # faster-coco-eval's figures are pycocotools' on the benchmark's own detections
    assert results["evaluation_cost"]["targets"][0]["met"] is True


def importance(results: dict) -> None:
    # the recorded curves at each step asked, the known answer at two sizes, the cost's four parts
    rows = results["importance"]["rows"][1:]
    assert [row[0] for row in rows] == [60, 300, "known answer", "known answer"] + ["cost at trials"] * 4
    assert rows[1][2] == pytest.approx(1.0)  # step 300 against itself


SPECIFIC = {"allocator": allocator, "tracking_server": tracking_server, "data_memory": data_memory,
            "evaluation_cost": evaluation_cost, "importance": importance}


def test_the_gpu_benchmark_refuses_a_machine_without_gpus_in_one_line(tmp_path):
    out = tmp_path / "results.json"
    no_gpu = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # none visible: so on a machine with GPUs too
    result = run_bounded([sys.executable, "-m", "bench.scaling", "--gpu", "--out", str(out)], cwd=REPO, timeout=120,
                         env=no_gpu)
    said = [line for line in result.stderr.splitlines() if line.startswith("bench.scaling")]
    assert result.returncode == 2 and said == ["bench.scaling --gpu: found no GPU (TensorFlow sees CPU:0), expected a "
                                               "machine with GPUs (--smoke runs it on two logical CPU devices)"], \
        result.stderr[-2000:]
    assert not out.exists()


def test_the_suites_record_sums_each_test_files_seconds_and_names_the_slowest_tests(tmp_path):
    from bench.suite import seconds_per_file, slowest_tests

    junit = tmp_path / "junit.xml"
    junit.write_text("""<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
    <testcase classname="tests.test_a" name="test_one" time="1.25" /><testcase classname="tests.test_b" name="test_x"
    time="4.0" /><testcase classname="tests.test_a.TestGroup" name="test_two" time="2.0" /></testsuite></testsuites>""")
    assert seconds_per_file(junit) == [("test_b.py", 4.0), ("test_a.py", 3.2)]
    assert slowest_tests(junit, 2) == [("test_b.py::test_x", 4.0), ("test_a.py::test_two", 2.0)]


def test_the_demo_bench_compares_what_two_sweeps_decided_by_the_trials_drawn_values():
    from bench.demo import decisions, outcome

    def report(scores: list[float], steps: list[int], best: int) -> dict:
        trials = [{"config": {"optimizer.learning_rate.learning_rate_base": rate, "optimizer.moving_average_decay": 0.99},
                   "status": "TERMINATED" if step == 300 else "STOPPED", "metrics": {"step": step, "eval/AP_best": score}}
                  for rate, score, step in zip((0.031, 0.045), scores, steps)]
        return {"metric": "eval/AP_best", "trials": trials, "best": trials[best]}

    quiet = report([0.2, 0.1], [300, 40], best=0)
    assert outcome(quiet) == {"learning_rate_base=0.031, moving_average_decay=0.99": ("TERMINATED", 300, 0.2),
                              "learning_rate_base=0.045, moving_average_decay=0.99": ("STOPPED", 40, 0.1)}
    assert decisions(quiet) == decisions(report([0.25, 0.1], [300, 40], best=0))  # scores aside, the same sweep
    assert decisions(quiet) != decisions(report([0.2, 0.1], [300, 120], best=0))  # a trial went further
    assert decisions(quiet) != decisions(report([0.2, 0.3], [300, 40], best=1))  # another winner


def test_throughput_windows_leave_out_tracing_and_the_final_checkpoint():
    marks = [(0, 0.0), (10, 5.0), (20, 6.0), (30, 7.0), (40, 9.0)]  # 5 s of tracing, a 2 s checkpoint
    assert throughputs(marks, batch_size=8) == [80.0, 80.0]


def test_results_md_keeps_the_hand_written_text_around_the_generated_tables(tmp_path):
    from dataclasses import asdict

    results, markdown = tmp_path / "results.json", tmp_path / "RESULTS.md"
    markdown.write_text("# Measured figures\n\nBefore/after notes, by hand.\n")
    entry = Entry(title="A bench", settings={"n": 1}, rows=[["what", "images/s"], ["x", 12.5]])
    results.write_text(json.dumps({"a": asdict(entry)}))
    render(results, markdown)
    render(results, markdown)  # idempotent: the generated part is replaced, not appended
    text = markdown.read_text()
    assert text.count("### A bench") == 1 and "Before/after notes, by hand." in text and "| x | 12.5 |" in text


def test_a_curves_file_is_one_trial_per_line_and_reads_back_to_six_significant_digits():
    from bench.record_curves import as_lines

    contents = {"recorded": "today", "sweep": "bench/curves_sweep.yaml", "paths": ["a"],
                "trials": [{"config": {"a": 0.0123456789}, "reports": [{"step": 20, "eval/loss": 1.23456789}]},
                           {"config": {"a": 0.5}, "reports": [{"step": 20, "eval/loss": 2.0}]}]}
    text = as_lines(contents)
    assert text.splitlines()[-4:-2] == ['{"config":{"a":0.0123456789},"reports":[{"step":20,"eval/loss":1.23457}]},',
                                        '{"config":{"a":0.5},"reports":[{"step":20,"eval/loss":2.0}]}']
    back = json.loads(text)
    assert back["recorded"] == "today" and back["paths"] == ["a"] and back["trials"][1] == contents["trials"][1]


def test_process_cpu_counts_the_cpu_of_a_process_the_command_started():
    """``bench.process_cpu``: a grandchild that spins for a second, then sleeps (so that the
    last look sees all it spent), is seen under its own title."""
    spin = "import time; end = time.process_time() + 1\nwhile time.process_time() < end: pass\ntime.sleep(1)"
    result = run_bounded([sys.executable, "-m", "bench.process_cpu", "--", "bash", "-c",
                          f"{sys.executable} -c '{spin}'"], cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    [row] = [line for line in result.stdout.splitlines() if "| -c import time; end" in line]
    assert 1.0 <= float(row.split("|")[1]) <= 1.5, result.stdout


def test_process_cpu_counts_a_window_of_the_run_and_how_often_a_process_wakes():
    """``--from``/``--for``: a grandchild that spins for half a second (before the window), then
    works and sleeps 5 ms by turns (about 100 wakeups a second): only the second part is counted."""
    work = ("import time; end = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"
            "stop = time.time() + 3\nwhile time.time() < stop:\n"
            "    t = time.process_time() + 0.005\n    while time.process_time() < t: pass\n    time.sleep(0.005)")
    result = run_bounded([sys.executable, "-m", "bench.process_cpu", "--every", "0.1", "--from", "2", "--for", "1",
                          "--", "bash", "-c", f"{sys.executable} -c '{work}'"], cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    [row] = [line for line in result.stdout.splitlines() if "| -c import time; end" in line]
    seconds, wakeups = float(row.split("|")[1]), float(row.split("|")[2])
    assert 0.2 <= seconds <= 0.8, result.stdout  # half of a 1 s window; the spin before it would add 0.5 s
    assert wakeups >= 50, result.stdout
    window = float(re.search(r"CPU s in ([\d.]+) s;", result.stdout).group(1))
    # it stopped counting after --for, not at the command's end (1.5 s later); the window opens
    # at the first sample past --from, up to one --every late on a loaded machine
    assert 0.9 <= window <= 1.5, result.stdout


def test_the_halving_bound_finds_the_cheapest_rungs_that_keep_the_best_configuration_by_hand():
    """Hand-made curves of 60 steps, four trials, the best (final AP 0.9) first in the list.

    A: it ranks last at step 20 and first at step 40. Keeping 1 at step 40 costs
    4×40 + 1×20 = 180 steps (75 % of FIFO's 240) and keeps it; within 50 % (120 steps) only
    "keep 1 at step 20" fits, and that stops it. A loss that falls as AP rises ranks the same.
    B: it ranks 2nd at step 20. Keeping 2 there costs 4×20 + 2×40 = 160 and keeps it; keeping
    2 at step 20, then 1 at step 40, costs 80 + 2×20 + 1×20 = 140 and keeps it too: the bound
    shows the cheaper."""
    from bench.replay_settings import best_halving, spent
    from detsweep.sweeps.replay import Curves

    def curves(at: dict[int, list[float]]) -> Curves:
        return Curves(["a"], [{"a": index} for index in range(4)],
                      [[{"step": step, "eval/AP_best": values[index], "eval/loss": 1 - values[index]}
                        for step, values in at.items()] for index in range(4)])

    def bound(at, share, allowed=lambda metric, step: True, metrics=("eval/AP_best",)):
        return best_halving(curves(at), "eval/AP_best", "max", metrics, 4, share, allowed, draws=20)

    last_then_first = {20: [0.1, 0.5, 0.4, 0.3], 40: [0.9, 0.2, 0.3, 0.1], 60: [0.9, 0.5, 0.4, 0.3]}
    assert spent(((20, 2), (40, 1)), 4, 60) == 4 * 20 + 2 * 20 + 1 * 20
    assert bound(last_then_first, 0.75, metrics=("eval/AP_best", "eval/loss")) == \
        {"eval/AP_best": (1.0, ((40, 1),)), "eval/loss": (1.0, ((40, 1),))}
    assert bound(last_then_first, 0.5) == {"eval/AP_best": (0.0, ((20, 1),))}
    assert bound(last_then_first, 0.75, allowed=lambda metric, step: step != 40) == {"eval/AP_best": (0.0, ((20, 1),))}
    assert bound(last_then_first, 0.25) == {"eval/AP_best": (0.0, None)}  # 60 steps: not even a rung at 20 fits
    second_then_first = {20: [0.45, 0.5, 0.4, 0.3], 40: [0.9, 0.2, 0.3, 0.1], 60: [0.9, 0.5, 0.4, 0.3]}
    assert bound(second_then_first, 0.75) == {"eval/AP_best": (1.0, ((20, 2), (40, 1)))}
