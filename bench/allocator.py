"""tcmalloc against glibc's malloc for detsweep's training loop: ``--repeats`` pairs of runs of
the bare loop (``bench.train_step``'s ``loop`` contender, the code a Ray Train worker runs), each
run a process of its own, the two of a pair back to back and their order alternating from pair
to pair. The noise is measured in the same run: the spread of the glibc runs among themselves.

    .venv/bin/python -m bench.allocator [--smoke] [--repeats N]
"""

from __future__ import annotations

from types import SimpleNamespace

from detsweep.cluster import fast_allocator

from .common import Entry, Target, arguments, median, record
from .train_step import bench_config, run_contender


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    windows, steps_per_loop = (4, 2) if args.smoke else (30, 10)
    if args.smoke:
        args.repeats = 1
    tcmalloc = fast_allocator()
    if not (tcmalloc or args.smoke):  # the smoke run checks the script: glibc on both sides will do
        raise SystemExit("bench.allocator: found no libtcmalloc_minimal.so.4 on this machine, expected it "
                         "(make bench installs libtcmalloc-minimal4)")
    config = bench_config(windows, steps_per_loop, args.smoke, [])
    runs = SimpleNamespace(smoke=args.smoke, overrides=[], batch_size=config.train.batch_size)
    pairs = []
    for repeat in range(args.repeats):
        order = [("glibc", {}), ("tcmalloc", tcmalloc)][:: 1 if repeat % 2 == 0 else -1]
        rates = {name: run_contender("loop", allocator, runs, windows, steps_per_loop, repeat).wall
                 for name, allocator in order}
        pairs.append((rates["glibc"], rates["tcmalloc"]))
        print(f"pair {repeat + 1}: glibc {rates['glibc']:.2f}, tcmalloc {rates['tcmalloc']:.2f} images/s", flush=True)
    ratios = [fast / plain for plain, fast in pairs]
    glibc = [plain for plain, _ in pairs]
    gain = median(ratios)
    noise = max(glibc) / min(glibc) - 1
    rows = [["pair", "glibc images/s", "tcmalloc images/s", "tcmalloc / glibc"]]
    rows += [[n + 1, plain, fast, fast / plain] for n, (plain, fast) in enumerate(pairs)]
    record("allocator", Entry(
        title="tcmalloc against glibc's malloc: the bare training loop, paired runs (bench/allocator.py)",
        settings={"config": "configs/quickstart.yaml", "batch_size": config.train.batch_size,
                  "steps_per_loop": steps_per_loop, "windows": windows, "repeats": args.repeats,
                  "tcmalloc": tcmalloc.get("LD_PRELOAD", "not on this machine: glibc on both sides")},
        rows=rows,
        targets=[Target("tcmalloc / glibc (median of pairs) beyond the glibc runs' own spread",
                        f"> 1 + {noise:.3f}", gain, gain > 1 + noise)],
        notes=[f"The pairs' ratios range {min(ratios):.3f}-{max(ratios):.3f}, median {gain:.3f}; the glibc runs "
               f"alone spread {noise:.1%} (fastest over slowest), the noise a gain must exceed.",
               "Each run a fresh process; images/s from the end of the first window (tracing) to the end of the "
               "last but one (a checkpoint), as bench.train_step measures them."],
    ), args.out)


if __name__ == "__main__":
    main()
