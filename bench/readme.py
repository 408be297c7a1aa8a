"""README's measured figures: one table in its *Speed* section, rendered from
``bench/results.json`` between two markers (``render`` in ``bench/common.py`` writes it with
``RESULTS.md``). A figure README states anywhere else is read from its own cell of the
results by a claim in ``tests/test_readme_figures.py``, which holds README to both."""

from __future__ import annotations

from collections.abc import Callable

BEGIN = "<!-- figures:begin (written by bench/run_all.py from bench/results.json) -->"
END = "<!-- figures:end -->"

Figure = Callable[[dict], str]


def x(ratio: float) -> str:
    return f"{ratio:.2f}x"


def percent(share: float) -> str:
    return f"{share * 100:.0f} %"


def cells(entry: dict, first_cell: str) -> list:
    """The row of ``entry``'s table whose first cell is ``first_cell``."""
    [row] = [row for row in entry["rows"][1:] if str(row[0]) == first_cell]
    return row


def value(entry: dict, name: str):
    """The second cell of ``entry``'s row ``name`` (the figure/value tables)."""
    return cells(entry, name)[1]


def leading(text: str) -> float:
    """42 from "42% (22%-73%)", 0.0 from "0.000 (0.295)"."""
    return float(text.split("%")[0].split(" ")[0])


def loop_vs_fit(entry: dict) -> str:
    return x(cells(entry, "detsweep loop, no Ray, plain python")[2])


def ray_train_vs_loop(entry: dict) -> str:
    return ", ".join(x(row[5]) for row in entry["rows"][1:])


def wall_vs_compute(entry: dict) -> str:
    return ", ".join(x(row[7]) for row in entry["rows"][1:])


def beside(entry: dict) -> str:
    idle = [row[2] for row in entry["rows"][2:4]]
    return "; ".join(x(ratio) for ratio in idle)


def startup(entry: dict) -> str:
    fresh, resume, floor = cells(entry, "**Tune asks → first step at Tune**")[1:]
    return f"{fresh:.1f} s, {resume:.1f} s; {floor:.1f} s"


def pipeline(entry: dict) -> str:
    return f"{value(entry, 'ratio'):.0f}x"


def pipeline_per_thread(entry: dict) -> str:
    [target] = [t for t in entry["targets"] if t["what"].startswith("images/s per pipeline thread")]
    return f"{target['measured']:.0f} images/s"


def halving_live(entry: dict) -> str:
    (_, _, fifo_steps, fifo_best, _), (_, _, steps, best, _) = entry["rows"][1:]
    return f"{percent(steps / fifo_steps)} ({steps} of {fifo_steps}); {best:.3f} against {fifo_best:.3f}"


def rerun_lead(entry: dict) -> str:
    (_, single, *_, mean, std, _, _, _), (*_, lead, low, high) = entry["rows"][1:3]
    return f"{mean:.3f} ± {std:.3f} against {single:.3f}; {lead:.3f} [{low:.3f}, {high:.3f}]"


REPLAYED = ("ASHA on eval/AP_best from step 40", "quickstart (sweeps/quickstart.yaml)",
            "BOHB + HyperBand on eval/AP_best (factor 3)")


def replayed(entry: dict) -> str:
    shares = [f"{leading(cells(entry, name)[1]):.0f} %, {leading(cells(entry, name)[2]):.3f}" for name in REPLAYED]
    return "; ".join(shares)


def scaling(entry: dict) -> str:
    return f"{x(cells(entry, '2')[3])}; {x(cells(entry, '1, XLA')[3])}"


def allocator(entry: dict) -> str:
    glibc = [row[1] for row in entry["rows"][1:]]
    return f"{x(entry['targets'][0]['measured'])}; {percent(max(glibc) / min(glibc) - 1)}"


def tracking_load(entry: dict) -> str:
    return (f"{value(entry, 'writes/s'):.1f} writes/s, p50 {value(entry, 'latency p50 (ms)'):.0f} ms, "
            f"p99 {value(entry, 'latency p99 (ms)') / 1000:.1f} s, {value(entry, 'lost writes')} lost")


def tracking_server(entry: dict) -> str:
    return x(cells(entry, "as shipped (credentials cached 60 s)")[2])


def zoo_retinanet(entry: dict) -> str:
    big, small = entry["rows"][1:3]
    return f"{big[1]:.1f} s and {small[1]:.1f} s; {big[3]:.1f} GiB"


def minutes(seconds: float) -> str:
    whole, rest = divmod(round(seconds), 60)
    return f"{whole} min {rest} s"


def suite(entry: dict) -> str:
    """The suite's time, then the machine's gauges taken before it (records from 2026-12-01 on)."""
    gauges = [f"{row[1]} s" for row in entry["rows"][1:] if row[0].startswith("machine gauge")]
    spent = f"{minutes(value(entry, 'make test, install included (s)'))} ({value(entry, 'tests passed')} tests)"
    return "; ".join([spent, *gauges])


def demo(entry: dict) -> str:
    return minutes(value(entry, "make demo, installed (s)"))


def demo_anywhere(entry: dict) -> str:
    (_, quiet, *_), (_, busy, *_) = entry["rows"][1:3]
    same = "every trial to the same step, the same winner" if entry["targets"][1]["met"] else \
        "**other steps or another winner**"
    return f"{minutes(quiet)}; {minutes(busy)}, {same}"


def large_sweep(entry: dict) -> str:
    """Each figure at every recorded size, smallest first."""
    def at(name: str, form: Callable[[float], str]) -> str:
        return " and ".join(form(value) for value in cells(entry, name)[1:])

    def seconds(value: float) -> str:
        return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"

    return (f"{at('driver_share_of_core', percent)}; {at('console_share_of_core', lambda v: f'{v * 100:.1f} %')}; "
            f"{at('delay_median_s', seconds)}; {at('end_s', seconds)}; {at('status_s', seconds)}, "
            f"{at('best_s', seconds)}")


def head_share(entry: dict) -> str:
    """Processes beside the training worker per running trial, and their unique memory."""
    beside = [row for row in entry["rows"][1:] if row[1]]
    processes = sum(row[2] for row in beside)
    return f"{processes:.1f} processes, {sum(row[2] * row[3] for row in beside) / 1024:.2f} GiB"


# (what was measured, the entry it was recorded as, how its figure is read from it)
FIGURES: list[tuple[str, str, Figure]] = [
    ("detsweep's loop against Keras `model.fit` (same model, data and batch; glibc's malloc)",
     "train_step", loop_vs_fit),
    ("a Ray Train worker against the bare loop at 2, 10 and 40 steps per loop (medians of paired runs)",
     "train_step_loops", ray_train_vs_loop),
    ("a Ray Train worker's wall-clock rate against its compute-only rate at 2, 10 and 40 steps per loop",
     "train_step_loops", wall_vs_compute),
    ("the bare loop beside an idle Ray cluster; beside an idle Ray Train run (against it alone)",
     "train_step_split", beside),
    ("a trial's start, from Tune asking Ray for its process to its first step at Tune: fresh, resumed (medians); "
     "a bare process's import, build and first step", "startup_1w", startup),
    ("the same with 2 Ray Train workers a trial", "startup_2w", startup),
    ("the input pipeline (raccoon photos) against what training consumes", "input_pipeline", pipeline),
    ("the input pipeline on one thread at 640 px with the zoo RetinaNet's augmentations (the target: 80)",
     "input_pipeline", pipeline_per_thread),
    ("live, 16 quickstart configurations to step 300: halving's training steps against FIFO's; its best eval/AP_best "
     "against FIFO's", "early_stopping", halving_live),
    ("FIFO's two best of those rerun over 3 other seeds: the best's mean ± std against its single run; its paired "
     "lead over the 2nd with its 90 % interval", "rerun", rerun_lead),
    ("replayed, 20 seeds: share of FIFO's steps and median regret of ASHA from step 40; the quickstart's "
     "halving; BOHB with HyperBand", "replay_settings", replayed),
    ("the model zoo's RetinaNet as imported (ResNet-50 FPN, levels 3-7), batch 2, 2 cores: seconds per step "
     "at 640 and 256 px; peak memory at 640 px", "zoo_retinanet", zoo_retinanet),
    ("2 CPU workers against 1; 1 worker with XLA against without", "scaling_cpu", scaling),
    ("tcmalloc against glibc's malloc, the bare loop (median of paired runs); the glibc runs' own spread",
     "allocator", allocator),
    ("the cluster's tracking stack: 200 trials' writes over HTTPS, its server restarted twice",
     "tracking_load", tracking_load),
    ("the MLflow server with credentials cached 60 s against MLflow's default", "tracking_server",
     tracking_server),
    ("a sweep through the real driver on the cluster's stack, training a stand-in, 32 trials at once, at 50 and 200 "
     "trials: the driver's share of a core; the console's; a report to Tune's decision (median); the sweep's end; "
     "`status`, `best`", "large_sweep", large_sweep),
    ("the same on MLflow's embedded SQLite with Tune reusing each trial's actor (no process start a trial), at 200 "
     "and 2 000 trials: the same figures", "large_sweep_sqlite_reused", large_sweep),
    ("the head's share of each running trial (4 real trials at once): processes beside its training worker, "
     "their unique memory", "head_share", head_share),
    ("`make test` from a clean clone, install included; the machine's gauges before it: a Python loop, "
     "a bare process's fork to its first training step", "suite", suite),
    ("`make demo` after that (the venv made): the quickstart sweep, 4 trials", "suite", demo),
    ("`make demo` from a fresh clone, install included, on a quiet machine; again beside two busy processes",
     "demo", demo_anywhere),
]


def render_figures(results: dict) -> str:
    """The table between the markers, one row per figure; "not recorded" where no run is."""
    lines = [BEGIN, "", "| measured | figure | recorded |", "|---|---|---|"]
    for what, name, figure in FIGURES:
        entry = results.get(name)
        told = (figure(entry), f"`{name}`, {entry['date'][:10]}") if entry else ("not recorded", f"`{name}`")
        lines.append(f"| {what} | {told[0]} | {told[1]} |")
    return "\n".join([*lines, "", END])


EXPORT_BEGIN = "<!-- export:begin (written by bench/run_all.py from bench/results.json) -->"
EXPORT_END = "<!-- export:end -->"


def render_export_table(results: dict) -> str:
    """The raccoon model's exports (``int8_export``): AP with its spread, AP50, size, latency."""
    entry = results.get("int8_export")
    if entry is None:
        return "\n".join([EXPORT_BEGIN, "not recorded", EXPORT_END])
    lines = [EXPORT_BEGIN, "", "| model | AP (± bootstrap spread) | AP50 | size (MB) | latency (ms) |", "|---|---|---|---|---|"]
    for name, ap, spread, ap50, size, latency, *_ in entry["rows"][1:]:
        lines.append(f"| {name} | {ap:.3f} ± {spread:.3f} | {ap50:.3f} | {cell(size)} | {cell(latency)} |")
    [target] = entry["targets"]
    met = "met" if target["met"] else "**not met**"
    lines += ["", f"int8 within one AP point of float: {met} (drop {target['measured']:.3f}, the paired bootstrap "
              f"spread of that drop {entry['settings']['int8_drop_spread']:.3f}). "
              f"Recorded `int8_export`, {entry['date'][:10]}, {entry['settings']['steps']} steps at "
              f"{entry['settings']['image_size']} px.", "", EXPORT_END]
    return "\n".join(lines)


RERUN_BEGIN = "<!-- rerun:begin (written by bench/run_all.py from bench/results.json) -->"
RERUN_END = "<!-- rerun:end -->"


def render_rerun_table(results: dict) -> str:
    """The recorded rerun (``rerun``): each configuration's single run, its seeds, mean and
    spread, the leader's lead with its interval, and the verdict."""
    entry = results.get("rerun")
    if entry is None:
        return "\n".join([RERUN_BEGIN, "not recorded", RERUN_END])
    header, *rows = entry["rows"]
    lines = [RERUN_BEGIN, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(f"{value:.3f}" if isinstance(value, float) else str(value) for value in row) + " |"
              for row in rows]
    settings = entry["settings"]
    lines += ["", f"{' '.join(note.rstrip('.') + '.' for note in entry['notes'])} Recorded `rerun`, "
              f"{entry['date'][:10]}: {settings['sweep']}, "
              f"{settings['num_steps']} steps.", "", RERUN_END]
    return "\n".join(lines)


def cell(value) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def rewrite(text: str, results: dict) -> str:
    """``text`` (README) with its figures table, its export table and its rerun table rendered anew."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    text = text[:start] + render_figures(results) + text[end:]
    start, end = text.index(EXPORT_BEGIN), text.index(EXPORT_END) + len(EXPORT_END)
    text = text[:start] + render_export_table(results) + text[end:]
    start, end = text.index(RERUN_BEGIN), text.index(RERUN_END) + len(RERUN_END)
    return text[:start] + render_rerun_table(results) + text[end:]
