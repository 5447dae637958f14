"""A simulated studio day (docs/performance.md, "Wait or pay"): the same arrivals under two rules
for armed jobs whose GPU places are all taken, run through the GPU pool's own book
(spillway/core/pool_book.py) in simulated time, in a second of CPU.

    .venv/bin/python bench/overflow_day.py [--hours 10] [--places 2] [--seed 7]

- "overflow when full" (CLOUD_OVERFLOW_AFTER_S=0): a job that finds every place taken goes to
  the cloud at once;
- "overflow past its patience": it joins the line when the pool's estimate of its start is
  within its patience, renders here when a place frees, and goes to the cloud when the pool's
  estimate of its start passes its patience (the renders ahead run long) or its wait reaches
  it; a longer estimate sends it to the cloud at once, none yet makes it wait out its patience
  (what a job does, workflows/video_job.py, with the pool's `late` answers).

Arrivals come in bursts (a burst every 20 to 60 min, 1 to 10 jobs within 5 minutes); renders
are drawn from a log-normal around 2 minutes; each job's patience is 2, 5, 10 or 20 minutes; a
cloud clip costs $0.28. Prints per rule: cloud jobs and spend, jobs that started later than
their patience, the mean and worst wait of local jobs, and the places' idle time.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spillway.core.gpu_pool import HostSeen, PoolAsk, PoolHost, PoolInput, PoolLeave
from spillway.core.hosts import ref
from spillway.core.pool_book import PoolBook

T0 = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
CLIP_USD = 0.28
PATIENCES_S = (120, 300, 600, 1200)
SEEN = [HostSeen(name="a40", reachable=True, headroom=True)]


@dataclass
class Job:
    name: str
    arrives: float
    render_s: float
    patience_s: float
    started: float | None = None
    cloud: bool = False


@dataclass(order=True)
class Event:
    at: float
    kind: str = field(compare=False)
    job: Job = field(compare=False)


def arrivals(hours: float, rng: random.Random) -> list[Job]:
    jobs: list[Job] = []
    t, n = 0.0, 0
    while True:
        t += rng.uniform(20 * 60, 60 * 60)
        if t >= hours * 3600:
            return jobs
        for _ in range(rng.randint(1, 10)):
            n += 1
            jobs.append(
                Job(
                    name=f"j{n:04d}",
                    arrives=t + rng.uniform(0, 300),
                    render_s=rng.lognormvariate(0, 0.5) * 120,
                    patience_s=rng.choice(PATIENCES_S),
                )
            )


def day(jobs: list[Job], places: int, patient: bool) -> list[Job]:
    """Every job's start and route under one rule."""
    book = PoolBook(PoolInput())
    book.configure([PoolHost(ref=ref("q", "a40", places), max_jobs=places)])
    events = [Event(j.arrives, "arrive", j) for j in jobs]
    heapq.heapify(events)
    by_name = {j.name: j for j in jobs}

    def start(job: Job, now: float) -> None:
        job.started = now
        heapq.heappush(events, Event(now + job.render_s, "done", job))

    def to_cloud(job: Job, now: float) -> None:
        ask_at = T0 + timedelta(seconds=job.arrives)
        book.give_back(PoolLeave(job_id=job.name, asked_at=ask_at), T0 + timedelta(seconds=now))
        job.cloud, job.started = True, now

    checks: set[float] = set()
    while events:
        event = heapq.heappop(events)
        now, job = event.at, event.job
        at = T0 + timedelta(seconds=now)
        ask_at = T0 + timedelta(seconds=job.arrives)
        if event.kind == "arrive":
            start_by = ask_at + timedelta(seconds=job.patience_s) if patient else None
            ask = PoolAsk(job_id=job.name, asked_at=ask_at, seen=SEEN, wait=patient)
            ask.start_by = start_by
            [(_, answer)] = [s for s in book.ask(ask, at) if s[0] == job.name]
            if answer.host is not None:
                start(job, now)
            elif patient and (answer.eta_s is None or answer.eta_s <= job.patience_s):
                heapq.heappush(events, Event(now + job.patience_s, "patience", job))
            else:
                to_cloud(job, now)
        elif event.kind == "done" and not job.cloud:
            leave = PoolLeave(job_id=job.name, asked_at=ask_at, render_s=job.render_s)
            book.give_back(leave, at)
            for name, answer in book.admit(at, freshness=timedelta(0)):
                if answer.host is not None:
                    start(by_name[name], now)
        elif event.kind == "patience" and job.started is None:
            to_cloud(job, now)
        for name, _ in book.late(at):
            if by_name[name].started is None:
                to_cloud(by_name[name], now)
        due = book.next_late(at)
        if due is not None and (check := (due - T0).total_seconds()) not in checks:
            checks.add(check)
            heapq.heappush(events, Event(max(check, now), "check", job))
    return jobs


def report(label: str, jobs: list[Job], places: int, hours: float) -> None:
    cloud = [j for j in jobs if j.cloud]
    local = [j for j in jobs if not j.cloud]
    late = [j for j in jobs if (j.started or 0) - j.arrives > j.patience_s + 1e-6]
    waits = [(j.started or 0) - j.arrives for j in local]
    busy = sum(j.render_s for j in local)
    span = max(max((j.started or 0) + j.render_s for j in local), hours * 3600)
    print(
        f"  {label:<28} cloud {len(cloud):3d} jobs ${len(cloud) * CLIP_USD:6.2f}   "
        f"late {len(late):2d}   local wait mean {statistics.mean(waits):5.0f} s "
        f"max {max(waits):5.0f} s   places idle {100 * (1 - busy / (places * span)):4.1f} %"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=10.0)
    parser.add_argument("--places", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    made = arrivals(args.hours, random.Random(args.seed))
    print(
        f"{len(made)} jobs over {args.hours:g} h in bursts, renders median "
        f"{statistics.median(j.render_s for j in made):.0f} s, {args.places} places, "
        f"patience 2/5/10/20 min"
    )
    for label, patient in (("overflow when full", False), ("overflow past its patience", True)):
        jobs = [Job(j.name, j.arrives, j.render_s, j.patience_s) for j in made]
        report(label, day(jobs, args.places, patient), args.places, args.hours)


if __name__ == "__main__":
    main()
