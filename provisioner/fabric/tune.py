"""`provision tune`: NCCL settings measured against NCCL's own defaults, recommended only when the gain is real.

The knobs are the environment variables NCCL's documentation (user guide, "Environment Variables") lists for the
algorithm, the protocol and the InfiniBand transport, with values the documentation allows:

- ``NCCL_ALGO`` Ring or Tree (every IB cluster has both; NVLS/CollNet need hardware the spec does not describe);
- ``NCCL_PROTO`` Simple only: LL and LL128 serve small messages, and the guide warns that forcing LL128 where NCCL
  did not enable it can corrupt data;
- ``NCCL_IB_QPS_PER_CONNECTION`` 2 or 4 (default 1): more queue pairs spread a connection over more paths
  (adaptive routing, ECMP);
- ``NCCL_MIN_NCHANNELS`` 16 or 32: more channels, more parallel transfers;
- ``NCCL_NET_GDR_LEVEL`` PIX, PHB or SYS: how far apart a GPU and its NIC may be for GPUDirect RDMA.

Each setting is one knob changed from the defaults, run ``repeats`` times next to the defaults' own runs. A setting
is recommended only when its median beats the defaults' median by more than the run-to-run spread: the larger of
the two ranges, five standard errors of the pooled run-to-run noise, and :data:`MIN_GAIN` (:func:`margin`); and
only the best one: knobs interact, and a combination nobody measured is not recommended.
Nothing changes on the nodes: the result is a table and the spec snippet (``software.nccl_env``) that the nccl role
writes to /etc/nccl.conf on the next converge. Every rank runs with ``NCCL_DEBUG_SUBSYS`` including ENV, and the
table says whether NCCL reported taking each setting ("NCCL_ALGO set by environment to Tree").
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

KNOBS: dict[str, tuple[str, ...]] = {
    "NCCL_ALGO": ("Ring", "Tree"),
    "NCCL_PROTO": ("Simple",),
    "NCCL_IB_QPS_PER_CONNECTION": ("2", "4"),
    "NCCL_MIN_NCHANNELS": ("16", "32"),
    "NCCL_NET_GDR_LEVEL": ("PIX", "PHB", "SYS"),
}
"""The knobs `provision tune` sweeps and their values (see the module's docstring)."""

DEFAULT_REPEATS = 3
SIGNIFICANCE = 5.0
"""Standard errors a gain must exceed (see :func:`margin`): against the pooled noise of a sweep with 3 runs per
setting, pure noise passes about once in a thousand comparisons (Student's t, 6+ degrees of freedom), while a 5 %
gain on a fabric whose runs scatter by 1 % still shows."""
MIN_GAIN = 0.025
"""The least gain (a fraction of the defaults' median) ever recommended, however tight the runs: two or three runs
per setting cannot estimate the noise (with normal noise, a 2-run pair's pooled estimate over a sweep of two
settings, 2 degrees of freedom, comes out below a third of the true noise about one time in ten), and a
recommendation changes every job on the cluster. 2.5 % is a policy, not a measured figure: above the lab's +-1 %
jitter, whose largest possible lead is 2 %, so noise alone never passes it."""
_TAKEN = re.compile(r"NCCL INFO (NCCL_[A-Z0-9_]+) set by environment to (.*?)\.?\s*$", re.M)


@dataclass(frozen=True)
class Sample:
    """One all-reduce: its bus bandwidth at the largest size (None: it failed, ``why``) and what NCCL took."""

    busbw: float | None
    why: str = ""
    taken: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Setting:
    """One knob changed from NCCL's defaults (``env`` empty: the defaults), and its runs."""

    env: dict[str, str]
    samples: list[Sample] = field(default_factory=list)

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.env.items()) or "NCCL defaults"

    @property
    def figures(self) -> list[float]:
        return [s.busbw for s in self.samples if s.busbw is not None]

    @property
    def complete(self) -> bool:
        """Every run gave a figure."""
        return bool(self.samples) and len(self.figures) == len(self.samples)

    @property
    def median(self) -> float | None:
        return statistics.median(self.figures) if self.figures else None

    @property
    def spread(self) -> float:
        """Run-to-run range (max - min) of the figures."""
        return max(self.figures) - min(self.figures) if len(self.figures) > 1 else 0.0

    @property
    def confirmed(self) -> bool:
        """NCCL said it took each of our settings, in every run whose output showed its settings."""
        if not self.env:
            return True
        reports = [s.taken for s in self.samples if s.taken]
        return bool(reports) and all(r.get(k, "").lower() == v.lower() for r in reports for k, v in self.env.items())


def taken(output: str) -> dict[str, str]:
    """The settings NCCL reported taking from its environment (``NCCL_X set by environment to V[.]``)."""
    return {m.group(1): m.group(2).strip() for m in _TAKEN.finditer(output)}


def plan(knobs: Sequence[str] | None = None) -> list[Setting]:
    """The defaults first, then one setting per (knob, value)."""
    names = list(KNOBS) if not knobs else list(knobs)
    return [Setting({})] + [Setting({k: v}) for k in names for v in KNOBS[k]]


def parse_knobs(text: str | None) -> list[str]:
    """``--knobs A,B``: the names, each one of :data:`KNOBS` (a ValueError names the unknown ones)."""
    if text is None:
        return list(KNOBS)
    names = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in names if k not in KNOBS]
    if unknown or not names:
        raise ValueError(f"--knobs {text!r}: {'unknown ' + ', '.join(unknown) if unknown else 'no knob'}; "
                         f"choose from {', '.join(KNOBS)}")
    return names


def sweep(settings: Sequence[Setting], measure: Callable[[Mapping[str, str]], Sample], repeats: int,
          progress: Callable[[str], None] = lambda _m: None) -> None:
    """Run each setting ``repeats`` times, round by round (each round runs every setting once), so a drift in the
    fabric over the sweep touches every setting alike."""
    for r in range(repeats):
        for s in settings:
            sample = measure(s.env)
            s.samples.append(sample)
            figure = f"{sample.busbw:.1f} GB/s" if sample.busbw is not None else f"failed: {sample.why}"
            progress(f"round {r + 1}/{repeats}: {s.label}: {figure}")


def noise(settings: Sequence[Setting]) -> float:
    """The run-to-run standard deviation of the sweep, pooled over every setting's own runs (each setting's
    scatter around its own mean is noise, whatever the knob does), in GB/s."""
    groups = [s.figures for s in settings if len(s.figures) > 1]
    dof = sum(len(g) - 1 for g in groups)
    if not dof:
        return 0.0
    return math.sqrt(sum((x - statistics.fmean(g)) ** 2 for g in groups for x in g) / dof)


def margin(defaults: Setting, s: Setting, sd: float) -> float:
    """How far ``s`` must beat the defaults' median to count: more than the larger run-to-run range of the two, and
    more than :data:`SIGNIFICANCE` standard errors of the difference (pooled noise ``sd``): with 2 or 3 runs a range
    can come out small by chance (the lab's +-1 % jitter once gave two runs 0.4 GB/s apart and a setting with no
    effect a 0.8 GB/s lead), and a recommendation changes every job on the cluster."""
    n_d, n_s = max(len(defaults.figures), 1), max(len(s.figures), 1)
    floor = MIN_GAIN * (defaults.median or 0.0)
    return max(defaults.spread, s.spread, SIGNIFICANCE * sd * math.sqrt(1 / n_d + 1 / n_s), floor)


def recommend(settings: Sequence[Setting]) -> Setting | None:
    """The best setting whose median beats the defaults' by more than the margin; None when none does."""
    defaults = settings[0]
    base = defaults.median
    if base is None or not defaults.complete:
        return None
    sd = noise(settings)
    better = [s for s in settings[1:] if s.complete and s.confirmed and s.median is not None
              and s.median - base > margin(defaults, s, sd)]
    return max(better, key=lambda s: s.median or 0.0, default=None)


def table(settings: Sequence[Setting]) -> list[str]:
    """One line per setting: median, range, runs, the change against the defaults, whether NCCL took it."""
    base = settings[0].median
    lines = [f"{'setting':40s} {'median GB/s':>11s} {'range':>7s} {'runs':>5s} {'vs defaults':>11s}  NCCL took it"]
    for s in settings:
        med = f"{s.median:.1f}" if s.median is not None else "failed"
        delta = (f"{(s.median - base) / base:+.1%}" if s.median is not None and base and s.env else "")
        runs = f"{len(s.figures)}/{len(s.samples)}"
        took = "" if not s.env else ("yes" if s.confirmed else "not reported")
        lines.append(f"{s.label:40s} {med:>11s} {s.spread:7.1f} {runs:>5s} {delta:>11s}  {took}")
    return lines


def snippet(best: Setting) -> str:
    """The spec lines that make the nccl role write ``best`` to /etc/nccl.conf."""
    body = "".join(f'    {k}: "{v}"\n' for k, v in best.env.items())
    return f"software:\n  nccl_env:\n{body}"


def report_text(settings: Sequence[Setting], notes: Sequence[str], error: str | None) -> str:
    """What `provision tune` prints: the table and the notes, then why the sweep did not run, or the advice to
    keep the defaults, or the recommendation with its spec snippet."""
    lines = [*(table(settings) if settings else []), *(f"note: {note}" for note in notes)]
    best = recommend(settings) if error is None else None
    if error is not None:
        lines.append(f"NOT RUN tune: {error}")
    elif best is None:
        lines.append("No setting beat NCCL's defaults by more than the run-to-run spread: keep the defaults.")
    else:
        gain = (best.median or 0.0) / (settings[0].median or 1.0) - 1
        lines.append(f"Recommended: {best.label} ({gain:+.1%} over the defaults' median, beyond the spread). Add to "
                     "the spec and converge; nothing was changed on the nodes:")
    return "".join(f"{line}\n" for line in lines) + (snippet(best) if best is not None else "")
