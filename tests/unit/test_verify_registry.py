"""The registry of verify checks (:mod:`provisioner.fabric.registry`) is the one place that names them: ``--only``,
its help, the default set per spec, the progress lines and the order a run takes come from it."""

from __future__ import annotations

import importlib
import typing
from pathlib import Path

import pytest

from provisioner import verify
from provisioner.cli import main
from provisioner.errors import UsageError
from provisioner.fabric import registry
from provisioner.fabric.registry import CHECKS, NAMES
from provisioner.spec import load_cluster, load_text
from provisioner.spec.cluster import Cluster
from provisioner.spec.models import TestName, Verify
from tests.unit import test_verify_orchestrator as orch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
EVERY = ["links", "versions", "pcie", "sm", "ipoib", "cabling", "bandwidth", "gpudirect", "nccl", "storage"]
WITH_USER = [*EVERY[:-1], "memlock", "storage"]  # a spec naming verify.user gets the memlock check


def test_every_check_has_one_entry_a_step_and_its_module() -> None:
    assert len(set(NAMES)) == len(NAMES) == len(CHECKS)
    assert verify.ALL_TESTS == NAMES
    assert set(verify._RUN) == set(NAMES)  # the verifier runs every entry and nothing else
    assert set(verify._REREAD) <= set(NAMES)
    assert {c.name for c in CHECKS if c.reread_label} <= set(verify._REREAD)
    for c in CHECKS:
        module = importlib.import_module(c.module)
        assert c.results[0] == module.CHECK, c.name  # its main result is its module's
        assert c.help and c.help == c.help.strip() and "\n" not in c.help


def test_every_result_name_is_one_a_fabric_module_or_the_verifier_writes() -> None:
    """Each name in ``results`` is a check constant of a fabric module (or the verifier's own ``sm_lid``)."""
    import pkgutil

    import provisioner.fabric

    constants = set()
    for info in pkgutil.iter_modules(provisioner.fabric.__path__):
        module = importlib.import_module(f"provisioner.fabric.{info.name}")
        constants |= {v for k, v in vars(module).items() if k.endswith(("CHECK", "CHECK_NAME")) and isinstance(v, str)}
    written = {r for c in CHECKS for r in c.results}
    assert written - constants == {"sm_lid"}
    assert '"sm_lid"' in Path(verify.__file__).read_text(encoding="utf-8")


def test_the_spec_lists_only_registry_checks_and_the_rest_go_with_links() -> None:
    listable = set(typing.get_args(TestName))
    assert listable <= set(NAMES)
    assert set(NAMES) - listable == {c.name for c in CHECKS if c.with_links}
    assert set(Verify().tests) <= listable


def test_a_full_run_reports_only_result_names_the_registry_gives(tmp_path: Path) -> None:
    run = verify.verify(orch.cluster(), tests=list(NAMES), remote=orch.FakeRemote(), state_dir=tmp_path,
                        server_grace_s=0, write=False)
    names = {c.name for c in run.report.checks}
    known = {r for c in CHECKS for r in c.results} | {"ssh", "baseline"}
    assert names and names <= known, names - known
    assert {"links", "versions", "bandwidth", "nccl"} <= names


def test_a_run_prints_each_checks_label_in_registry_order(tmp_path: Path) -> None:
    said: list[str] = []
    verify.verify(orch.cluster(), tests=["nccl", "bandwidth", "links"], remote=orch.FakeRemote(), state_dir=tmp_path,
                  server_grace_s=0, write=False, progress=said.append, mode="quick")
    c = orch.cluster()
    labels = [registry.progress_label(registry.BY_NAME[n], c, "quick") for n in ("links", "bandwidth", "nccl")]
    assert [m for m in said if m in labels] == labels
    assert labels[1] == "bandwidth: ib_write_bw per rail (quick mode)"
    assert said.index(labels[0]) < said.index(labels[1]) < said.index(labels[2])
    assert said[-1].startswith("verify: ")
    assert registry.BY_NAME["links"].reread_label in said  # the counters read again at the end


def test_only_keeps_run_order_drops_blanks_and_names_every_choice_on_a_bad_name() -> None:
    assert registry.parse_only(["storage", " links", "", "cabling"]) == ["links", "cabling", "storage"]
    with pytest.raises(UsageError) as exc:
        registry.parse_only(["links", "linkz", "gpu"])
    text = str(exc.value)
    assert "\n" not in text and text.startswith("unknown test(s): gpu, linkz (choose from ")
    assert text.endswith(f"(choose from {', '.join(NAMES)})")


def test_cli_only_rejects_an_unknown_check_in_one_line_before_anything_runs(capsys: pytest.CaptureFixture[str],
                                                                           tmp_path: Path) -> None:
    state = tmp_path / "state"
    rc = main(["verify", str(EXAMPLES / "h100-ndr-8node.yaml"), "--only", "links,linkz", "--out", str(state)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("provision: error: unknown test(s): linkz (choose from ")
    assert all(name in err for name in NAMES)
    assert not state.exists()  # refused before the spec was loaded or the state directory locked


def test_cli_help_lists_every_check_with_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--help"]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    assert f"Comma list of checks: {', '.join(NAMES)} " in flat
    lines = out.splitlines()
    at = lines.index("  Checks (--only), in the order a run takes them:")
    listed = lines[at + 1:at + 1 + len(CHECKS)]
    assert [ln.split(maxsplit=1) for ln in listed] == [[c.name, c.help] for c in CHECKS]
    assert all(len(ln) <= 80 for ln in listed), listed  # one line per check in an 80-column terminal


@pytest.mark.parametrize(("example", "want"), [
    ("a100-10gbe-2node.yaml", ["nccl"]),  # the spec lists nccl only: nothing goes with it
    ("a100-hdr-4node.yaml", ["links", "versions", "pcie", "sm", "cabling", "bandwidth", "gpudirect", "nccl"]),
    ("h100-ndr-64node-3tier.yaml", ["links", "versions", "pcie", "sm", "cabling", "bandwidth", "gpudirect", "nccl"]),
    ("h100-ndr-8node-2hca.yaml", EVERY),
    # the example names verify.user (memlock) and lists dcgm: dcgm runs after cabling, before the traffic checks
    ("h100-ndr-8node.yaml", ["links", "versions", "pcie", "sm", "ipoib", "cabling", "dcgm", "bandwidth", "gpudirect",
                             "nccl", "memlock", "storage"]),
    # no iblinkinfo on RoCE, and no subnet manager: sm no longer goes with links there (it ran and reported nothing)
    ("roce-200g-4node.yaml", ["links", "versions", "pcie", "bandwidth", "gpudirect", "nccl"]),
    # the lab spec pins software.dcgm: the dcgm role is in its converge, so dcgm runs without being listed
    ("lab/cluster.yaml", [*EVERY[:6], "dcgm", *EVERY[6:]]),
])
def test_default_set_per_example_spec(example: str, want: list[str]) -> None:
    """The sets select_tests gave before the registry (recorded from it), now in run order; on RoCE without sm;
    pcie goes with gpudirect (the path GPUDirect runs over)."""
    cluster, _ = load_cluster(EXAMPLES / example, None)
    assert verify.select_tests(cluster, None) == registry.default_for(cluster) == want


def test_dcgm_runs_by_default_where_the_converge_installs_it_and_not_elsewhere() -> None:
    """The gpu_stack play runs the dcgm role on the GPU nodes of a spec that pins software.dcgm: that spec gets the
    dcgm check without listing it, at verify.dcgm.level (default 1); without the pin (no dcgmi on the nodes) it
    runs only when listed (and never without GPUs: the registry's needs)."""
    text = (EXAMPLES / "a100-hdr-4node.yaml").read_text()
    assert "dcgm" not in text
    pinned = load_text(text.replace("software:\n", 'software:\n  dcgm: "3.3.9"\n', 1), "cluster.yaml").cluster
    plain = load_text(text, "cluster.yaml").cluster
    assert pinned is not None and plain is not None
    assert "dcgm" in registry.default_for(pinned) and "dcgm" not in registry.default_for(plain)
    assert pinned.spec.verify.dcgm.level == 1
    assert registry.progress_label(registry.BY_NAME["dcgm"], pinned, None).startswith("dcgm: dcgmi diag -r 1 ")


# -- a run that would check nothing never passes ---------------------------------------------------------------


def _roce(tests: str | None = None) -> Cluster:
    """The orchestrator's RoCE spec (no InfiniBand port, no IPoIB, no mounts), its verify.tests replaced."""
    text = orch.SPEC if tests is None else orch.SPEC.replace("tests: [links, bandwidth, nccl]", f"tests: {tests}")
    res = load_text(text, "cluster.yaml")
    assert res.cluster is not None and (tests is None or text != orch.SPEC)
    return res.cluster


def test_a_check_with_needs_says_what_it_lacks_and_only_then() -> None:
    for c in CHECKS:
        assert bool(c.lacks) == (c.needs is not None), c.name
    assert registry.unmet(registry.BY_NAME["sm"], _roce()) == registry.BY_NAME["sm"].lacks
    assert registry.unmet(registry.BY_NAME["links"], _roce()) is None
    ib, _ = load_cluster(EXAMPLES / "h100-ndr-8node.yaml", None)
    assert [registry.unmet(c, ib) for c in CHECKS] == [None] * len(CHECKS)  # it plans every one


@pytest.mark.parametrize("value", [",", "", " , ,"])
def test_only_with_no_name_is_a_usage_error(value: str) -> None:
    with pytest.raises(UsageError) as exc:
        registry.parse_only(value.split(","))
    assert str(exc.value) == f"--only names no check (choose from {', '.join(NAMES)})"
    with pytest.raises(UsageError):
        verify.select_tests(_roce(), [])  # the same for a caller's own list


@pytest.mark.parametrize("value", [",", ""])
def test_cli_only_with_no_name_is_refused_in_one_line_before_anything_runs(
        value: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    state = tmp_path / "state"
    rc = main(["verify", str(EXAMPLES / "roce-200g-4node.yaml"), "--only", value, "--out", str(state)])
    out, err = capsys.readouterr()
    assert rc == 2 and "PASS" not in out
    assert err == f"provision: error: --only names no check (choose from {', '.join(NAMES)})\n"
    assert not state.exists()


NO_SM = (("subnet_manager", "the spec plans no InfiniBand port, so there is no subnet manager to check"),)
NO_IPOIB = (("ipoib", "the spec plans no IPoIB interfaces"),)
NO_MOUNTS = (("storage", "the spec lists no NFS or Lustre mounts"),)


@pytest.mark.parametrize(("only", "want"), [
    (["sm"], NO_SM),
    (["storage"], NO_MOUNTS),
    (["ipoib"], NO_IPOIB),
    (["storage", "sm", "ipoib"], NO_SM + NO_IPOIB + NO_MOUNTS),  # in run order
])
def test_only_checks_with_nothing_to_check_could_not_run_and_nothing_is_asked(
        only: list[str], want: tuple[tuple[str, str], ...], tmp_path: Path) -> None:
    remote = orch.FakeRemote()
    said: list[str] = []
    run = verify.verify(_roce(), tests=only, remote=remote, state_dir=tmp_path, write=False, progress=said.append)
    assert tuple((c.name, c.error) for c in run.report.checks) == want
    assert all(c.node is None for c in run.report.checks)
    assert run.exit_code == 2 and run.report.verdict.label == "INCOMPLETE"
    assert remote.calls == []  # not even the every-node answer probe
    assert said == ["verify: INCOMPLETE"]


def test_only_sm_with_links_on_roce_runs_links_and_says_sm_could_not_run(tmp_path: Path) -> None:
    run = verify.verify(_roce(), tests=["sm", "links"], remote=orch.FakeRemote(), state_dir=tmp_path, write=False)
    links = [c for c in run.report.checks if c.name == "links"]
    assert len(links) == 4 and all(c.ran for c in links)
    assert tuple((c.name, c.error) for c in run.report.checks if c.name == "subnet_manager") == NO_SM
    assert run.exit_code != 0 and run.report.verdict.could_not_run >= 1  # never PASS without sm


def test_a_spec_whose_tests_all_have_nothing_to_check_does_not_pass(tmp_path: Path) -> None:
    cluster = _roce("[storage, ipoib]")
    assert registry.default_for(cluster) == []
    run = verify.verify(cluster, remote=orch.FakeRemote(), state_dir=tmp_path, write=False)
    assert tuple((c.name, c.error) for c in run.report.checks) == NO_IPOIB + NO_MOUNTS
    assert run.exit_code == 2


def test_a_spec_that_lists_no_test_does_not_pass(tmp_path: Path) -> None:
    run = verify.verify(_roce("[]"), remote=orch.FakeRemote(), state_dir=tmp_path, write=False)
    assert [(c.name, c.error) for c in run.report.checks] == [("verify", "the spec's verify.tests names no check")]
    assert run.exit_code == 2


def test_a_check_that_gives_no_result_leaves_the_run_incomplete(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(verify._RUN, "nccl", lambda v, mode: None)
    run = verify.verify(_roce(), tests=["nccl"], remote=orch.FakeRemote(), state_dir=tmp_path, write=False)
    assert [(c.name, c.error) for c in run.report.checks] == [("verify", "no check gave a result (nccl)")]
    assert run.exit_code == 2


def test_cli_only_sm_on_roce_is_incomplete_with_the_reason(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    rc = main(["verify", str(EXAMPLES / "roce-200g-4node.yaml"), "--only", "sm", "--out", str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert rc == 2
    assert out[0] == f"NOT RUN subnet_manager cluster: {NO_SM[0][1]}"
    assert out[1].startswith("INCOMPLETE: ") and len(out) == 2


def test_the_traffic_checks_are_marked_in_the_registry_as_the_busy_rule_had_them() -> None:
    # the checks kept off nodes running Slurm jobs: the four verify.TRAFFIC_CHECKS named before the registry
    # owned the mark (test_verify_slurm_busy proves the rule itself)
    assert [c.name for c in registry.CHECKS if c.traffic] == ["dcgm", "bandwidth", "gpudirect", "nccl"]
    assert not hasattr(verify, "TRAFFIC_CHECKS")
