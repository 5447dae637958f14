"""The GPU pool's book answering a burst: `--asks` jobs lined one after another at one instant
(as the pool applies a burst's batch in one workflow task), each answered with its position and
estimated start, two places held and three renders seen so that the estimate is computed. Prints
the seconds each way of taking the estimate: kept between answers (what the book does) and from
the line's head at every answer (what it did before, `PoolBook._etas` over the line so far).
Temporal's deadlock detection fails a workflow task that does not yield within 2 s.

    .venv/bin/python bench/line_estimate.py [--asks 500 --asks 2000]
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spillway.core.gpu_pool import HostSeen, PoolAsk, PoolHost, PoolInput
from spillway.core.hosts import ref
from spillway.core.pool_book import PoolBook

T0 = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
FREE = [HostSeen(name="a40", reachable=True, headroom=True)]
BUSY = [HostSeen(name="a40", reachable=True, headroom=False)]


class FromTheHead(PoolBook):
    """Each estimate taken from the line's head, as the book did before it kept one."""

    def _line_etas(self, now: datetime, upto: int) -> list[float | None]:
        return self._etas(now, self.line[:upto])


def burst(kind: type[PoolBook], asks: int) -> float:
    book = kind(PoolInput())
    book.configure([PoolHost(ref=ref("q", "a40", 2), max_jobs=2)])
    for holder in ("h1", "h2"):
        book.ask(PoolAsk(job_id=holder, asked_at=T0, seen=FREE), T0)
    book.holds_s["a40"] = [60.0, 70.0, 80.0]
    now = T0 + timedelta(seconds=5)
    started = time.perf_counter()
    for i in range(asks):
        ask = PoolAsk(job_id=f"job-{i:05d}", asked_at=T0 + timedelta(seconds=1 + i), seen=BUSY)
        book.ask(ask, now)
    assert len(book.line) == asks
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--asks", type=int, action="append", help="repeat (500, 1000, 2000)")
    sizes = parser.parse_args().asks or [500, 1000, 2000]
    print("asks lined at one instant: seconds of the book's work, estimate kept / from the head")
    for n in sizes:
        kept, head = burst(PoolBook, n), burst(FromTheHead, n)
        print(f"  {n:5d}   {kept:6.3f} s / {head:6.3f} s   ({head / kept:.0f}x)")


if __name__ == "__main__":
    main()
