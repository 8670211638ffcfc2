"""Recovery fuzz (issue 34), many seeded cases: random damage anywhere in a stopped
store of several segments, then open it and read it as a fresh cluster would.

    .venv/bin/python bench/fuzz_recovery.py                 # 2,000 cases
    .venv/bin/python bench/fuzz_recovery.py --cases 10000 --seed 5000
    .venv/bin/python bench/fuzz_recovery.py --only 1262     # one case, verbose

Per case (lockmq.testing.store_fuzz): every acknowledged record still intact on
disk is delivered exactly once, nothing that was not acknowledged whole is ever
delivered, and every lost record is named by the store (a quarantined range, the
cut torn tail, or an index it rebuilds at the next start). Half the cases start from
a clean shutdown, half from a crash image (a tail after the checkpoint). The work
directory is on /dev/shm when there is one (the cases are fsync-bound otherwise).
Exits 1 if any case fails, printing its seed and damage.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "host"))

from lockmq.testing.store_fuzz import build_image, run_case  # noqa: E402


def _kind(name: str) -> str:
    if name.endswith(".qstart"):
        return "queue-start"
    if name[0].isdigit():
        return "segment"
    if name.startswith("offset-"):
        return "index"
    if name.startswith("consume-") or name == "positions.copy":
        return "positions"
    return name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--only", type=int, help="run this one seed, with the store's log")
    ap.add_argument("--records", type=int, default=400, help="records per image")
    args = ap.parse_args()
    if args.only is None:
        logging.disable(logging.CRITICAL)
    else:
        logging.basicConfig(level=logging.INFO)
    root = tempfile.mkdtemp(prefix="lockmq-fuzz-",
                            dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        imgs = [build_image(os.path.join(root, "clean"), records=args.records),
                build_image(os.path.join(root, "crash"), crashed=True, records=args.records)]
        seeds = [args.only] if args.only is not None else \
            range(args.seed, args.seed + args.cases)
        t0 = time.monotonic()
        failed = 0
        kinds: Counter[str] = Counter()
        lost = delivered = 0
        for seed in seeds:
            r = run_case(imgs[seed % 2], os.path.join(root, "work"), seed)
            for d in r.damage:
                how, name = d.split()[0], d.split()[1].split("@")[0]
                kinds[f"{how} {_kind(name)}"] += 1
            lost += r.lost
            delivered += r.delivered
            if not r.ok or args.only is not None:
                failed += not r.ok
                print(f"seed {seed}: {'ok' if r.ok else 'FAILED'}; damage {r.damage}; "
                      f"intact {r.intact}, delivered {r.delivered}, lost {r.lost}; "
                      f"{r.failures}")
        n = len(seeds)
        print(f"{n} cases in {time.monotonic() - t0:.1f} s: {n - failed} ok, {failed} failed; "
              f"records delivered {delivered}, lost to damage {lost}")
        print("damage applied: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
        return 1 if failed else 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
