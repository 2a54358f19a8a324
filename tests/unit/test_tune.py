"""`provision tune` (provisioner/fabric/tune.py): the sweep, the spread rule, what NCCL reports taking, the snippet
that goes back into the spec, and the whole command against a simulated remote."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from provisioner.fabric import tune
from provisioner.render import build_inventory
from provisioner.spec import load_cluster, load_text

ROOT = Path(__file__).resolve().parents[2]

# real NCCL INFO lines (int parameters end with a period, strings do not): NCCL_IB_QPS_PER_CONNECTION from a
# RoCE run log, NCCL_ALGO/NCCL_NET_GDR_LEVEL as NCCL's tuning.cc and paths.cc print them (NVIDIA/nccl issues)
TAKEN = """\
vm-host40:34001:34053 [0] NCCL INFO NCCL_IB_QPS_PER_CONNECTION set by environment to 4.
vm-host40:34001:34053 [0] NCCL INFO NCCL_IB_GID_INDEX set by environment to 3.
gpu-dev-7d5e8186:1795:1795 [0] NCCL INFO NCCL_ALGO set by environment to ring,tree
test1:5425:5439 [0] NCCL INFO NCCL_NET_GDR_LEVEL set by environment to SYS
"""


def test_the_settings_nccl_reports_taking_are_read_from_its_info_lines() -> None:
    assert tune.taken(TAKEN) == {"NCCL_IB_QPS_PER_CONNECTION": "4", "NCCL_IB_GID_INDEX": "3",
                                 "NCCL_ALGO": "ring,tree", "NCCL_NET_GDR_LEVEL": "SYS"}


def test_the_plan_is_the_defaults_then_one_knob_at_a_time() -> None:
    plan = tune.plan(["NCCL_IB_QPS_PER_CONNECTION", "NCCL_ALGO"])
    assert [s.label for s in plan] == ["NCCL defaults", "NCCL_IB_QPS_PER_CONNECTION=2",
                                       "NCCL_IB_QPS_PER_CONNECTION=4", "NCCL_ALGO=Ring", "NCCL_ALGO=Tree"]
    assert len(tune.plan()) == 1 + sum(len(v) for v in tune.KNOBS.values())
    with pytest.raises(ValueError, match="unknown NCCL_P2P_LEVEL"):
        tune.parse_knobs("NCCL_ALGO,NCCL_P2P_LEVEL")
    assert "NCCL_PROTO" in tune.KNOBS and tune.KNOBS["NCCL_PROTO"] == ("Simple",)  # no forced LL128



def run(figures: Mapping[str, list[float]], knobs: list[str], repeats: int = 3) -> list[tune.Setting]:
    """A sweep whose runs return the listed figures in turn per setting label, NCCL taking every setting."""
    left = {k: list(v) for k, v in figures.items()}
    settings = tune.plan(knobs)

    def measure(env: Mapping[str, str]) -> tune.Sample:
        label = ", ".join(f"{k}={v}" for k, v in env.items()) or "NCCL defaults"
        return tune.Sample(left[label].pop(0), "", dict(env))

    tune.sweep(settings, measure, repeats)
    return settings


def test_a_gain_within_the_run_to_run_spread_is_not_recommended() -> None:
    settings = run({"NCCL defaults": [90.0, 94.0, 92.0], "NCCL_IB_QPS_PER_CONNECTION=2": [93.0, 95.0, 94.5],
                    "NCCL_IB_QPS_PER_CONNECTION=4": [91.0, 92.0, 93.0]}, ["NCCL_IB_QPS_PER_CONNECTION"])
    assert settings[0].median == 92.0 and settings[0].spread == 4.0
    assert settings[1].median == 94.5  # +2.5 GB/s, inside the defaults' 4 GB/s range
    assert tune.recommend(settings) is None


def test_noise_that_happens_to_lead_is_not_recommended() -> None:
    """What the lab's +-1 % jitter once produced with 2 runs each: the knob does nothing, yet its runs sat 0.8 GB/s
    above the defaults' with both ranges under 0.5 GB/s. The pooled noise of the sweep says that is chance."""
    settings = run({"NCCL defaults": [93.52, 93.91], "NCCL_IB_QPS_PER_CONNECTION=2": [93.1, 94.6],
                    "NCCL_IB_QPS_PER_CONNECTION=4": [94.28, 94.74]}, ["NCCL_IB_QPS_PER_CONNECTION"], repeats=2)
    best = settings[2]
    assert best.median is not None and settings[0].median is not None
    assert best.median - settings[0].median > max(settings[0].spread, best.spread)  # the range rule alone: fooled
    assert tune.noise(settings) == pytest.approx(0.660, abs=1e-3)  # margin 5 x 0.66 x 1 = 3.3 GB/s
    assert tune.recommend(settings) is None


def test_a_lead_smaller_than_the_minimum_gain_is_not_recommended_however_tight_the_runs() -> None:
    """What two lab workers' sweep measured (the knob has no effect in the lab): each setting's two runs landed
    within 0.12 GB/s, so the pooled noise came out 0.06 GB/s while the lab's jitter is +-1 %, and a 1.4 % lead
    passed five standard errors. Two or three runs cannot estimate the noise: below MIN_GAIN nothing is advised."""
    settings = run({"NCCL defaults": [93.21, 93.09], "NCCL_IB_QPS_PER_CONNECTION=2": [93.5, 93.52],
                    "NCCL_IB_QPS_PER_CONNECTION=4": [94.48, 94.50]}, ["NCCL_IB_QPS_PER_CONNECTION"], repeats=2)
    best, base = settings[2].median, settings[0].median
    assert best is not None and base is not None
    assert best - base > tune.SIGNIFICANCE * tune.noise(settings) * 1.0  # the standard-error rule alone: fooled
    assert tune.recommend(settings) is None
    lead = {"NCCL defaults": [93.21, 93.09], "NCCL_IB_QPS_PER_CONNECTION=2": [93.5, 93.52],
            "NCCL_IB_QPS_PER_CONNECTION=4": [96.5, 96.52]}  # +3.6 %, still tight: a real gain is advised
    best_setting = tune.recommend(run(lead, ["NCCL_IB_QPS_PER_CONNECTION"], repeats=2))
    assert best_setting is not None and best_setting.label == "NCCL_IB_QPS_PER_CONNECTION=4"


def test_a_gain_beyond_the_spread_is_recommended_with_its_snippet() -> None:
    settings = run({"NCCL defaults": [60.0, 61.0, 60.5], "NCCL_IB_QPS_PER_CONNECTION=2": [70.0, 71.0, 70.0],
                    "NCCL_IB_QPS_PER_CONNECTION=4": [80.0, 82.0, 81.0]}, ["NCCL_IB_QPS_PER_CONNECTION"])
    best = tune.recommend(settings)
    assert best is not None and best.label == "NCCL_IB_QPS_PER_CONNECTION=4"
    snippet = tune.snippet(best)
    assert yaml.safe_load(snippet) == {"software": {"nccl_env": {"NCCL_IB_QPS_PER_CONNECTION": "4"}}}
    lines = tune.table(settings)
    assert lines[1].split()[:3] == ["NCCL", "defaults", "60.5"]
    assert "+33.9%" in lines[3] and lines[3].rstrip().endswith("yes")


def test_a_setting_nccl_did_not_report_or_a_failed_run_is_never_recommended() -> None:
    settings = tune.plan(["NCCL_MIN_NCHANNELS"])
    for s, figure, took in ((settings[0], 50.0, {}), (settings[1], 90.0, {}), (settings[2], 90.0, None)):
        s.samples += [tune.Sample(figure, "", took or {"NCCL_IB_HCA": "x"}) for _ in range(2)]
    settings[2].samples.append(tune.Sample(None, "exit 1"))
    assert not settings[1].confirmed and not settings[2].complete
    assert tune.recommend(settings) is None
    assert tune.table(settings)[2].rstrip().endswith("not reported")


def test_the_spec_carries_the_recommendation_to_nccl_conf(tmp_path: Path) -> None:
    text = (ROOT / "examples" / "h100-ndr-8node.yaml").read_text()
    spec = tmp_path / "c.yaml"
    (tmp_path / "keys").mkdir()
    spec.write_text(text.replace("software:\n", "software:\n  nccl_env: {NCCL_IB_QPS_PER_CONNECTION: \"4\"}\n", 1))
    cluster, _ = load_cluster(spec)
    inv = build_inventory(cluster)
    conf = inv.groupvars["profile_hgx_h100"]["nccl_conf"]
    assert conf["NCCL_IB_QPS_PER_CONNECTION"] == "4" and conf["NCCL_IB_HCA"].startswith("=mlx5_0:1")
    assert "NCCL_IB_QPS_PER_CONNECTION" not in inv.groupvars.get("profile_mgmt", {}).get("nccl_conf", {})
    bad = load_text(text.replace("software:\n", "software:\n  nccl_env: {LD_PRELOAD: /tmp/x.so}\n", 1), "c.yaml")
    assert bad.cluster is None and any("nccl_env" in d.format() for d in bad.errors)


def test_tune_leaves_nodes_running_jobs_out_naming_them_and_changes_nothing(tmp_path: Path) -> None:
    """The whole sweep on the fake Slurm cluster of test_verify_slurm_busy: n5 runs job 41, so every srun step of
    the sweep runs over n1-n4, each with its setting in the environment it exports; NCCL's real 16-rank capture
    gives the same figure every run, so nothing is recommended; no command but squeue/scontrol/srun ran."""
    from provisioner.verify import tune_nccl
    from tests.unit.test_verify_slurm_busy import SlurmRemote, cluster

    remote = SlurmRemote({"n5": "41"})
    run = tune_nccl(cluster(), knobs=["NCCL_IB_QPS_PER_CONNECTION"], repeats=2, remote=remote,  # type: ignore[arg-type]
                    state_dir=tmp_path)
    assert run.error is None and run.exit_code == 0
    assert [s.label for s in run.settings] == ["NCCL defaults", "NCCL_IB_QPS_PER_CONNECTION=2",
                                               "NCCL_IB_QPS_PER_CONNECTION=4"]
    assert all(len(s.figures) == 2 for s in run.settings)
    assert any("n5: Slurm runs job 41 on n5" in n for n in run.notes), run.notes
    steps = [a for _, a, _ in remote.calls if a[0] == "env" and "srun" in a]
    assert len(steps) == 6 and all("--nodelist=n1,n2,n3,n4" in s for s in steps)
    assert sum("NCCL_IB_QPS_PER_CONNECTION=4" in s for s in steps) == 2
    assert all("NCCL_DEBUG_SUBSYS=INIT,NET,ENV" in s for s in steps if any("QPS" in a for a in s))
    assert tune.recommend(run.settings) is None  # the capture does not report taking the setting, nor beat itself
    assert {a[0] for _, a, _ in remote.calls} <= {"squeue", "scontrol", "env", "true", "sh"}


def test_tune_on_a_cluster_whose_gpu_nodes_all_run_jobs_could_not_run_naming_the_jobs(tmp_path: Path) -> None:
    from provisioner.verify import tune_nccl
    from tests.unit.test_verify_slurm_busy import SlurmRemote, cluster

    remote = SlurmRemote({f"n{i}": f"4{i}" for i in range(1, 6)})
    run = tune_nccl(cluster(), knobs=["NCCL_ALGO"], repeats=2, remote=remote, state_dir=tmp_path)  # type: ignore[arg-type]
    assert run.exit_code == 2 and run.error is not None
    assert "n3: Slurm runs job 43 on n3" in run.error, run.error
    assert not [a for _, a, _ in remote.calls if a[0] == "env"], "no all-reduce was started"
