"""README's figures are the recorded ones. Its *Speed* table is rendered from
``bench/results.json`` (``bench/readme.py``). Every other figure it states (a measurement
with its unit, a count, a score) is in a claim below: README's words with ``{}`` where each
figure goes, and the cells of ``bench/results.json`` that fill them. A claim binds each
figure to its own measurement; a figure no claim holds must be in one of README's phrases
that state a setting or a limit. A benchmark run again changes the figures; this test then
names the sentence to change with it."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable

from bench.readme import (
    BEGIN,
    END,
    EXPORT_BEGIN,
    EXPORT_END,
    RERUN_BEGIN,
    RERUN_END,
    render_export_table,
    render_figures,
    render_rerun_table,
)

from .conftest import REPO

README = (REPO / "README.md").read_text()
RESULTS = json.loads((REPO / "bench" / "results.json").read_text())

# A measurement with its unit (20.5 s, 31 %, 0.72x, 29.4 writes/s, 12 GB), a count (13 200,
# 6 of 16, 5th of 24, 1480 of …, 200 trials) or a score (0.025).
UNIT = r"\d+(?:\.\d+)?(?: ?%|x\b| (?:s|ms|min|minutes|hours|images/s|writes/s|GB|GiB|MB)\b)"
COUNT = (r"\d{1,3}(?: \d{3})+\b|\d+(?:st|nd|rd|th)? of \d+\b|\d+(?= of )|\d+(?= (?:writes|seeds|trials|"
         r"configurations|steps|runs|pairs|params|metrics|checkpoints|reports|images|tests|actors)\b)")
SCORE = r"\d+\.\d+(?![\w.])"
FIGURE = re.compile(rf"(?<![\w.,/=-])(?:{UNIT}|{COUNT}|{SCORE})")


def entry(name: str) -> dict:
    return RESULTS[name]


def row(name: str, first_cell: str) -> list:
    return next(cells for cells in entry(name)["rows"] if cells[0] == first_cell)


def percent(share: float) -> str:
    return f"{share:.0%}".replace("%", " %")


def grouped(count: int) -> str:
    return f"{count:,}".replace(",", " ")


def replay(quickstart: str = "quickstart (sweeps/quickstart.yaml)") -> tuple:
    settings, (_, share, regret, *_) = entry("replay_settings")["settings"], row("replay_settings", quickstart)
    recorded = int(re.search(r"of (\d+) recorded", entry("replay_settings")["notes"][0])[1])
    kept_40 = math.ceil(settings["samples"] / 3)
    asha_share = row("replay_settings", "ASHA on eval/AP_best from step 40")[1]
    median_regret, worst = re.fullmatch(r"([\d.]+) \(([\d.]+)\)", regret).groups()
    best_at_40 = re.search(r"\| eval/AP_best \| \d+ \| (\d+) \|", entry("replay_settings")["notes"][4])[1]
    return (settings["samples"], recorded, settings["seeds"], kept_40, settings["samples"], math.ceil(kept_40 / 3),
            share.split("%")[0] + " %", f"{float(median_regret):g}", asha_share.split("%")[0] + " %", worst,
            settings["seeds"], best_at_40, recorded)


def data_memory() -> tuple:
    peak = {(cells[0], cells[2]): cells[3] for cells in entry("data_memory")["rows"][1:]}
    estimate = entry("data_memory")["targets"][1]["measured"]
    return (f"{peak[(1000, 'streamed')]:.0f}", f"{peak[(20000, 'streamed')]:.0f}", f"{peak[(5000, 'in memory')]:.0f}",
            f"{estimate:.1f}")


def evaluation() -> tuple:
    here = {cells[0]: cells[1] for cells in entry("evaluation_cost")["rows"][1:]}
    return (f"{here['inference, s an image, batch 8 (pipeline, network, to COCO' + chr(39) + 's form)']:.2f}",
            f"{here['input pipeline alone, s an image']:.4f}", f"{here['detections to COCO' + chr(39) + 's form, s an image']:.4f}",
            f"{here['COCOeval on 5 000 images, pycocotools, s']:.0f}",
            f"{here['COCOeval on 5 000 images, faster-coco-eval, s']:.0f}")


def evaluation_shares() -> tuple:
    rows = {cells[0]: cells[1:] for cells in entry("evaluation_cost")["rows"][1:]}
    before = rows["share of the trial's time: as before (pycocotools, batch 8)"]
    faster = rows["share of the trial's time: faster-coco-eval"][1]
    return percent(before[0]), percent(before[1]), percent(faster)


def evaluation_levers() -> tuple:
    rows = {cells[0]: cells[1:] for cells in entry("evaluation_cost")["rows"][1:]}
    sharded = "share of the trial's time: faster-coco-eval, inference sharded over 2 workers (built; at a GPU's speed an estimate)"
    [read] = [cells for name, cells in rows.items() if name.startswith("an async evaluation's start: val set")]
    actor = ("an evaluator actor keeping the model and val set (not built): the start it saves, share of an evaluation "
             "with faster-coco-eval")
    rebuilt = rows["an async evaluation's start: model rebuilt from the checkpoint, s"][0]
    return percent(rows[sharded][1]), f"{rebuilt:.1f}", f"{read[0]:.2f}", percent(rows[actor][1])


def importance() -> tuple:
    settings = entry("importance")["settings"]
    small, big = settings["known"]
    return (big["trials"], f"{big['share']:.2f}", f"{big['low']:.2f}", f"{big['high']:.2f}", f"{big['others_high']:.2f}",
            small["trials"], f"{small['low']:.2f}", f"{small['high']:.2f}", f"{small['others_high']:.2f}",
            settings["settled_from_step"])


def importance_cost() -> tuple:
    cost = {cells[3]: cells for cells in entry("importance")["rows"][1:] if cells[0] == "cost at trials"}
    [boot] = [cells for name, cells in cost.items() if name.startswith("the bootstrap")]
    [whole] = [cells for name, cells in cost.items() if name.startswith("all of it")]
    return (grouped(whole[1]), grouped(int(whole[2].split()[0])), f"{boot[4]:.0f}",
            f"{cost['one PED-ANOVA evaluation, s'][4]:.2f}", f"{whole[4]:.0f}", f"{cost['fANOVA, s'][4]:.0f}")


def tracking_load() -> tuple:
    settings = entry("tracking_load")["settings"]
    value = {cells[0]: cells[1] for cells in entry("tracking_load")["rows"][1:]}
    return (settings["trials"], settings["actors"], settings["params"], settings["metrics"], settings["steps"],
            settings["checkpoints"], settings["checkpoint_mb"], grouped(value["writes done"]),
            f"{value['writes/s']:.1f}", f"{value['latency p50 (ms)']:.0f}", f"{value['latency p99 (ms)'] / 1000:.1f}",
            value["lost writes"], value["checkpoints READY"].split("/")[0],
            f"{value['MB of checkpoints written'] / 1000:.0f}")


def start_up() -> tuple:
    def total(name: str) -> list[float]:
        return row(name, "**Tune asks → first step at Tune**")[1:]

    (before_fresh, before_resume, _), (fresh, resume, floor) = total("startup_1w_before"), total("startup_1w")
    fresh_2w, resume_2w, floor_2w = total("startup_2w")
    return tuple(f"{seconds:.1f}" for seconds in (before_fresh, fresh, before_resume, resume, floor, fresh_2w,
                                                  resume_2w, floor_2w))


def early_stopping() -> tuple:
    found = entry("early_stopping")
    share, gap = (target["measured"] for target in found["targets"])
    _, fifo_steps, halving_steps = (cells[2] for cells in found["rows"])
    twice, spread = re.search(r"(\d+) configurations trained all .* ([\d.]+) at most", found["notes"][1]).groups()
    aimed = found["targets"][1]["goal"].removeprefix("<= ")
    return (found["settings"]["samples"], found["settings"]["num_steps"], percent(share), halving_steps, fifo_steps,
            f"{gap:.3f}", aimed, twice, spread)


def rerun() -> tuple:
    found = entry("rerun")
    (_, single, *_, mean, std, _, _, _), (*_, lead, low, high) = found["rows"][1:3]
    return (len(found["settings"]["seeds"]), f"{mean:.3f}", f"{std:.3f}", f"{single:.3f}", f"{lead:.3f}",
            f"{low:.3f}", f"{high:.3f}")


def allocator() -> tuple:
    pairs = entry("allocator")["rows"][1:]
    return sum(ratio > 1 for *_, ratio in pairs), len(pairs)


def large_sweep() -> tuple:
    def at(name: str, form: str) -> list[str]:
        return [form.format(value) for value in row("large_sweep", name)[1:]]

    small, large = entry("large_sweep")["rows"][0][1:]
    share = [f"{value * 100:.0f} %" for value in row("large_sweep", "driver_share_of_core")[1:]]
    console = [f"{value * 100:.1f} %" for value in row("large_sweep", "console_share_of_core")[1:]]
    return (small, large, *share, *at("driver_peak_mb", "{:.0f}"), *console, max(row("large_sweep", "most_rows")[1:]),
            *at("end_s", "{:.0f} s"), *at("best_s", "{:.1f} s"), large, at("status_s", "{:.1f} s")[-1],
            at("delay_median_s", "{:.1f} s")[-1], at("delay_p95_s", "{:.0f} s")[-1],
            at("suggest_ms_first", "{:.1f} ms")[-1], at("suggest_ms_last", "{:.0f} ms")[-1], large, large,
            f"{row('large_sweep', 'wall_s')[-1] / 60:.0f} minutes")


def reused_sweep() -> tuple:
    def at(name: str, form: str) -> str:
        return " and ".join(form.format(value) for value in row("large_sweep_sqlite_reused", name)[1:])

    sizes = " and ".join(f"{size:,}".replace(",", " ") for size in entry("large_sweep_sqlite_reused")["rows"][0][1:])
    def shares(name: str, form: str = "{:.0%}") -> str:
        return at(name, form).replace("%", " %")

    return (sizes, at("wall_s", "{:.0f} s"), shares("driver_share_of_core"), shares("console_share_of_core", "{:.1%}"),
            at("delay_median_s", "{:.2f} s"), at("delay_p95_s", "{:.1f} s"), shares("loop_waiting_for_core_share"),
            at("load_average_median", "{:.0f}"), at("end_s", "{:.1f} s"), at("status_s", "{:.1f} s"),
            at("best_s", "{:.1f} s"), at("importance_s", "{:.1f} s"), at("runs_open", "{}"), at("lost_writes", "{}"))


def head_share() -> tuple:
    found = entry("head_share")
    beside = [row for row in found["rows"][1:] if row[1]]
    each = sum(row[2] * row[3] for row in beside) / 1024
    [trial] = [row for row in beside if row[0] == "Trial"]
    return (found["settings"]["trials_at_once"], f"{sum(row[2] for row in beside):.0f} processes", f"{each:.2f} GiB",
            f"{trial[3]:.0f} MB", f"{32 * each:.0f} GiB")


# README's words with {} for each figure, and the figures, read from bench/results.json.
CLAIMS: list[tuple[str, Callable[[], tuple]]] = [
    ("On the recorded curves ({} of {} configurations per sweep, {} seeds), halving from step 40 by 3 keeps {} of "
     "{} at step 40 and {} at step 120: **{}** of FIFO's steps with median regret {}, where ASHA with the same "
     "first rung and factor spends {} (`bench/RESULTS.md`). That is in sample (the recording chose the rung), "
     "and it does not always keep the best configuration (a regret of {} in the worst of the {} seeds): at step "
     "40 the best ranks {}th of {}.", replay),
    ("Every resume is a trial start ({} s here, from Tune asking for it",
     lambda: (f"{row('startup_1w', '**Tune asks → first step at Tune**')[2]:.1f}",)),
    ("one pipeline thread gives {} images/s here",
     lambda: (f"{row('input_pipeline', entry('input_pipeline')['rows'][-1][0])[1]:.0f}",)),
    ("sends {} trials' writes through this stack (PostgreSQL, moto's S3 server, basic auth, HTTPS) from {} Ray "
     "actors standing in for trials, each through a trial's own retrying writer: per trial {} params, {} metrics "
     "at each of {} steps and {} checkpoints of {} MB, with the server killed and started again twice mid-run. "
     "Recorded here (`bench/RESULTS.md`): {} writes at {} writes/s, p50 {} ms and p99 {} s from submit to done "
     "(retries across the restarts included), {} lost writes, every metric history whole and in step order, all "
     "{} checkpoints READY and none left PENDING, {} GB uploaded.", tracking_load),
    ("{} → {} s fresh, {} → {} s resumed, against a floor of {} s (`startup_1w_before`, `startup_1w`); with 2 "
     "workers a trial, {} s fresh and {} s resumed against a floor of {} s in that run (`startup_2w`).", start_up),
    ("On {} of its configurations trained to step {} (the recorded curves' budget and cadence; the demo stops at "
     "step 160), live, it trained {} of FIFO's steps ({} of {}), and the configuration it kept scored {} AP below FIFO's "
     "best, against the {} aimed at (`early_stopping`). A paused trial now resumes exactly where it paused, and each "
     "trains on one thread: {} configurations trained to the end in both sweeps scored alike to the last digit ({} at "
     "most between two runs).", early_stopping),
    ("rerun over {} other seeds (`rerun`, *Whether the winner is real*), FIFO's best configuration scored {} ± {} "
     "against its single run's {}, and its lead over FIFO's runner-up, {} [{}, {}], holds zero", rerun),
    ("no gain beyond the glibc runs' own spread ({} of {} pairs favoured it", allocator),
    ("At {} and {} trials the driver used {} and {} of a core (at most {} and {} MB), its console {} and {}, never "
     "more than {} rows; every run was closed and no write lost; the sweep's end took {} and {}, `best` {} and {}. "
     "Not met at {} trials: `status` took {} (it reads each trial's results from the bucket one after another), and "
     "a report reached Tune's decision {} after it was made at the median ({} at the 95th percentile), where 1 s is "
     "aimed at.", lambda: large_sweep()[:-5]),
    ("TPE's suggestion time grew from {} to {} over the {} trials. Fresh trial processes made {} trials take {} "
     "here", lambda: large_sweep()[-5:]),
    ("With Tune reusing each trial's actor (`--reuse`: the same trial process, started once for many trials) on "
     "MLflow's embedded SQLite (`large_sweep_sqlite_reused`), {} trials took {}: the driver used {} of a core and "
     "its console {}; a report reached Tune's decision {} after it was made at the median ({} at the 95th "
     "percentile), Tune's loop waiting for a core {} of the time at a load near {}; the sweep's end took {}, "
     "`status` {}, `best` {}, `importance` {}; {} runs were left open and {} writes lost.", reused_sweep),
    ("With {} real quickstart trials at once (`bench/large_sweep.py`, `head_share` in `bench/RESULTS.md`) that "
     "was {} and {} of unique memory a trial, the trial's own process the largest ({}). A head for N trials at "
     "once needs about N times that beside MLflow's server and Ray's own processes: 32 trials at once, about {}.",
     head_share),
    ("that reports a recorded curve of `bench/curves.json` in {} with {} MB checkpoints and its node's system "
     "metrics, {} trials at once", lambda: (
         f"{entry('large_sweep')['settings']['report_every_s'] * 15:.0f} s", entry("large_sweep")["settings"][
             "checkpoint_mb"], entry("large_sweep")["settings"]["at_once"])),
    ("{} concurrent actors write {} trials over HTTPS",
     lambda: (entry("tracking_load")["settings"]["actors"], entry("tracking_load")["settings"]["trials"])),
    ("Most of the time goes to Ray starting trials ({} s each here from Tune asking",
     lambda: (f"{row('startup_1w', '**Tune asks → first step at Tune**')[1]:.1f}",)),
    ("One epoch of generated COCO-sized records (640 × 480 JPEGs of about 160 KB) streamed at a buffer of 1 000 "
     "peaked at {} MB with 1 000 records and {} MB with 20 000, where the same records held whole took {} MB at "
     "5 000 (`bench/RESULTS.md`, `data_memory`). A GPU worker training on COCO is estimated at {} GiB of host "
     "memory: that peak, which does not grow with the records, the network with its optimizer's slots and moving "
     "average on the host (on a GPU they live on the device), and rank 0's val set of 5 000 images held whole for "
     "evaluation.", data_memory),
    ("An evaluation of val2017's 5 000 images, timed here on 300 generated ones: {} s an image for a whole pass on "
     "2 CPUs, {} s an image for the input pipeline and {} s for the detections' conversion to COCO's form; COCOeval "
     "on 5 000 images' detections took {} s with pycocotools and {} s with faster-coco-eval", evaluation),
    ("For the COCO recipe (raw and averaged weights evaluated every 2 500 steps of 64 images on two workers), an "
     "evaluation's share of the trial's time is {} here and, at a GPU's speed, {} with pycocotools and {} with "
     "faster-coco-eval (`bench/RESULTS.md`, `evaluation_cost`; no GPU here, so the network's GPU throughput is "
     "assumed there, 100 images/s evaluating and 40 images/s training a GPU, and every CPU-bound part is as "
     "measured).", evaluation_shares),
    ("An inline evaluation is sharded over the trial's workers, each detecting on its share, which brings the recipe's "
     "share at a GPU's speed to an estimated {} (inference divided over its two workers; no GPU here to measure it). "
     "`train.evaluation: async` takes evaluations off the training's path (no worker waits) at the cost of one more "
     "worker's resources (its GPU, with `use_gpu`) while each runs; each rebuilds the model ({} s here) and reads the "
     "val set ({} s for 300 images) before its first image, which an evaluator that kept them (an actor, holding a "
     "worker's resources for the whole trial) would save: {} of an evaluation at a GPU's speed, so it is not built.",
     evaluation_levers),
    ("On a known-answer set where only the learning rate matters (`bench/RESULTS.md`, `importance`), {} compared "
     "trials gave the learning rate {} [{}, {}], clear of every other setting's (at most {}); {} gave it [{}, {}] "
     "against the others' highest {}: the interval is how a sweep says it cannot tell yet. On the recorded curves, "
     "each step's importances rank the settings as step 300's do (rank correlation 0.8 or more) from step {}.",
     importance),
    ("At {} trials ({} compared) the bootstrap's 200 resamples took {} s here, where one PED-ANOVA evaluation "
     "takes {} s, and all of it {} s, {} s of which fANOVA's", importance_cost),
]

# README's phrases whose figures are settings, limits, versions or rules, not measurements.
SETTINGS = [
    "Ray from 2.58",
    "Tune gives a reused actor 2 s to end its last trial",
    "(the benchmark now allows 60 s)",
    "A sweep of 1 000 trials is not measured yet",
    "Not met at 2 000 trials",
    "with 5 swept parameters it needs 12 trials ranked at one rung",
    "keeping 1 in 3 at step 40 ranks on little: the demo's 4 trials",
    "`max_t` 600 steps evaluated every 200 is 3",
    "Tune 2.60's HyperBand",
    "9 of 15 reports",
    "0.5 s as detsweep starts Ray",
    "Ray Train poll every 0.5 s",
    "polls its workers, every 2 s",
    "at Ray's 2 s",
    "Ray Train's 2 s poll",
    "at 2 steps per loop",
    "trusts a checked password for 60 s",
    "each test fails after 10 minutes",
    "up to 15 minutes",
    "the run stops after 80 minutes",
    "The budget is 45 minutes; the aim is 35",
    "IoU >= 0.5",
    "stddev 0.05",
    "(the zoo's 0.01)",
    "rounds of 10 runs",
    "within 5 % of each other",
    "more than one AP point (0.01)",
    "Optuna 5.1 passed so before the lock took it; MLflow 3.18 cannot be installed",
    "COCO's TFRecords are about 19 GB; `ray_cluster.yaml` gives each node a 200 GB volume",
    "TensorFlow 2.21 reads no `s3://` itself",
    "with a 90 % interval; on the recorded sweep of `bench/curves.json` (24 configurations trained to step 300)",
    "deepest evaluated step that at least 20 trials reached (failed trials count nowhere). Fewer than 20 at every step",
    "with a top quantile of 10 %, or as much as holds 5 trials (at most 25 %)",
    "the per-seed differences over the seeds both finished, with a 90 % t interval",
    "a sweep with fewer than 2 configurations whose trials ended without",
    "Past 15 trials the table is a window",
    "The shipped head, an `m6i.2xlarge` with 32 GiB, holds the 8 trials its 8 GPU workers can train at once",
    "(waiting up to 15 s for them all, a monitor still starting included, before the up to 60 s it gives its "
    "run's own writes)",
]


def words(text: str) -> str:
    return " ".join(text.split())


def prose() -> str:
    """README without its two rendered tables and its code blocks, its lines joined."""
    text = README
    for begin, end in ((BEGIN, END), (EXPORT_BEGIN, EXPORT_END), (RERUN_BEGIN, RERUN_END)):
        text = text.replace(text[text.index(begin):text.index(end)], "")
    return words(re.sub(r"```.*?```", "", text, flags=re.S))


def claimed() -> list[str]:
    return [template.format(*read()) for template, read in CLAIMS]


def test_the_speed_table_is_the_one_results_json_renders():
    table = README[README.index(BEGIN):README.index(END) + len(END)]
    assert table == render_figures(RESULTS), "run: .venv/bin/python -c 'from bench.common import render; render()'"


def test_the_export_table_is_the_one_results_json_renders():
    table = README[README.index(EXPORT_BEGIN):README.index(EXPORT_END) + len(EXPORT_END)]
    assert table == render_export_table(RESULTS), "run: .venv/bin/python -c 'from bench.common import render; render()'"


def test_the_rerun_table_is_the_one_results_json_renders():
    table = README[README.index(RERUN_BEGIN):README.index(RERUN_END) + len(RERUN_END)]
    assert table == render_rerun_table(RESULTS), "run: .venv/bin/python -c 'from bench.common import render; render()'"


def test_every_claim_states_the_figures_of_its_own_cells():
    text = prose()
    wrong = [sentence for sentence in claimed() if sentence not in text]
    assert not wrong, f"README does not say, as bench/results.json records: {wrong}"


def test_every_figure_outside_the_table_is_in_a_claim_or_a_setting():
    text = prose()
    assert not [phrase for phrase in SETTINGS if phrase not in text], "a setting README no longer states"
    for phrase in claimed() + SETTINGS:
        text = text.replace(phrase, "")
    unbound = [match.group() for match in FIGURE.finditer(re.sub(r"`[^`]*`", "", text))]
    assert not unbound, f"figures README states that no claim reads from bench/results.json: {unbound}"


def test_the_figure_pattern_sees_units_counts_and_scores():
    found = [match.group() for match in FIGURE.finditer(
        "13 200 writes at 29.4 writes/s, 12 GB, 6 of 16 and 2 at step 120, 1480 of FIFO's, ranks 5th of 24, "
        "0.025 AP, 31 %, 0.72x, 20 seeds; Python 3.11.2 and step 40 are not figures")]
    assert found == ["13 200", "29.4 writes/s", "12 GB", "6 of 16", "1480", "5th of 24", "0.025", "31 %", "0.72x",
                     "20"]
