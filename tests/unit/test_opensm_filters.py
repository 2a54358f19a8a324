"""The opensm role's decisions on how a running SM takes a change: SIGHUP, restart (in which order) or nothing."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import yaml

from provisioner.lab.simtools import fabsim_sm

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "roles" / "opensm" / "filter_plugins" / "opensm_filters.py"
RELOADABLE = yaml.safe_load((ROOT / "roles" / "opensm" / "vars" / "main.yml").read_text())["opensm_reloadable_options"]

CONF = """# managed
guid 0xa088c20300010000
sm_priority 15
sminfo_polling_timeout 10000
polling_retry_number 4
routing_engine ar_updn
partition_config_file /etc/opensm/partitions.conf
log_file /var/log/opensm.log
log_max_size 0
"""


def _filters() -> ModuleType:
    spec = importlib.util.spec_from_file_location("opensm_filters", PLUGIN)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_partition_change_alone_is_a_reload() -> None:
    plan = _filters().opensm_conf_apply(CONF, CONF, RELOADABLE["nvidia"], partitions_changed=True)
    assert plan == {"action": "reload", "changed": [], "restart_for": []}


def test_runtime_options_reload_others_restart() -> None:
    f = _filters()
    prio = CONF.replace("sm_priority 15", "sm_priority 13")
    assert f.opensm_conf_apply(CONF, prio, RELOADABLE["upstream"])["action"] == "reload"
    engine = CONF.replace("ar_updn", "updn")
    assert f.opensm_conf_apply(CONF, engine, RELOADABLE["nvidia"])["action"] == "reload"
    assert f.opensm_conf_apply(CONF, engine, RELOADABLE["upstream"]) == {
        "action": "restart", "changed": ["routing_engine"], "restart_for": ["routing_engine"]}
    root = CONF + "root_guid_file /etc/opensm/root_guids.conf\n"
    assert f.opensm_conf_apply(CONF, root, RELOADABLE["nvidia"])["restart_for"] == ["root_guid_file"]
    # a reloadable line removed: the rescan reads only present lines, the old value would stay
    gone = CONF.replace("routing_engine ar_updn\n", "")
    assert f.opensm_conf_apply(CONF, gone, RELOADABLE["nvidia"])["restart_for"] == ["routing_engine"]


def test_nothing_to_do_when_unchanged_or_just_started() -> None:
    f = _filters()
    assert f.opensm_conf_apply(CONF, CONF + "# comment\n", RELOADABLE["nvidia"])["action"] == "none"
    fresh = f.opensm_conf_apply("", CONF, RELOADABLE["nvidia"], partitions_changed=True, started=True)
    assert fresh["action"] == "none"


def test_the_role_and_the_lab_agree_on_what_reloads() -> None:
    """The role's list (from osm_subnet.c and NVIDIA's docs) matches the simulated opensm's table."""
    for build, keys in RELOADABLE.items():
        for key in keys:
            assert fabsim_sm.reloadable(key, upstream=build == "upstream"), (build, key)
    written = ("guid", "partition_config_file", "log_file", "root_guid_file", "cn_guid_file")
    assert not any(fabsim_sm.reloadable(k, upstream=False) for k in written)


def test_restart_order_standbys_first_master_last() -> None:
    plans = [
        {"host": "sm1", "action": "restart", "master": True, "priority": 15},
        {"host": "sm3", "action": "reload", "master": False, "priority": 12},
        {"host": "sm2", "action": "restart", "master": False, "priority": 14},
        {"host": "sm4", "action": "restart", "master": False, "priority": 13},
    ]
    assert _filters().opensm_restart_order(plans) == ["sm4", "sm2", "sm1"]


def test_vendor_default_engine_is_not_judged() -> None:
    """No engines configured: whichever the build routes with passes; an explicit non-AR list still fails AR."""
    f = _filters()
    log = ("Jan 01 00:00:00 000000 [00000000] 0x80 -> Entering MASTER state\n"
           "Jan 01 00:00:00 000000 [00000000] 0x02 -> osm_ucast_mgr_process: ar_updn tables configured on all"
           " switches\nJan 01 00:00:00 000000 [00000000] 0x80 -> SUBNET UP\n")
    assert f.opensm_routing(log, False, [])["problems"] == []
    assert f.opensm_routing(log, False, ["updn"])["problems"]


# ---------------------------------------------------------------- partition members that do not answer

TEMPLATE = ROOT / "roles" / "opensm" / "templates" / "partitions.conf.j2"


def _render_partitions(members: dict[str, list[str]]) -> str:
    """The role's partitions.conf template, rendered with Jinja the way the role renders it (two members)."""
    import re

    import jinja2

    env = jinja2.Environment(keep_trailing_newline=True, trim_blocks=True)
    # the three Ansible filters the template uses, as Ansible defines them
    env.filters["flatten"] = lambda seq: [x for s in seq for x in (s if isinstance(s, list) else [s])]
    env.filters["extract"] = lambda key, container: container[key]
    env.filters["regex_replace"] = lambda value, pattern, repl: re.sub(pattern, repl, value)
    parts = [{"name": "tenant_a", "pkey": "0x8001", "members": sorted(members), "membership": "full"}]
    return env.from_string(TEMPLATE.read_text()).render(
        ansible_managed="managed", opensm_default_partition="full", opensm_default_pkey="0x7fff",
        opensm_default_partition_ipoib_mtu=0, opensm_partitions=parts, opensm_member_guids=members,
        opensm_own_guids=[])


def test_a_member_that_does_not_answer_keeps_the_guids_partitions_conf_records() -> None:
    f = _filters()
    members = {"gpu01": ["0xa088c20300000001", "0xa088c20300000002"], "gpu02": ["0xa088c20300000003"]}
    conf = _render_partitions(members)
    assert "# member gpu01: 0xa088c20300000001,0xa088c20300000002\n" in conf
    # the lab's opensm (like opensm's parser) reads the records as comments: two partitions, three members
    parsed = fabsim_sm.parse_partitions(conf)
    assert [p["name"] for p in parsed] == ["Default", "tenant_a"]
    assert [m["member"] for m in parsed[1]["members"]] == [g for gs in members.values() for g in gs]
    # the next converge: gpu01 paused (unreachable), gpu02 answers with its ports
    results = [{"item": "gpu01", "unreachable": True, "msg": "Connection timed out during banner exchange"},
               {"item": "gpu02", "ports": [{"device": "mlx5_0", "port": 1, "guid": "0xa088c20300000003",
                                            "link_layer": "InfiniBand"},
                                           {"device": "mlx5_1", "port": 1, "guid": "0xa088c20300000004",
                                            "link_layer": "Ethernet"}]}]
    out = f.opensm_member_guids(results, conf)
    assert out == {"guids": members, "kept": ["gpu01"], "missing": []}
    assert _render_partitions(out["guids"]) == conf  # nothing in partitions.conf changes while gpu01 is away


def test_a_member_never_seen_and_not_answering_is_missing() -> None:
    f = _filters()
    failed = [{"item": "gpu03", "failed": True, "msg": "no /sys/class/infiniband"}]
    assert f.opensm_member_guids(failed, "") == {"guids": {}, "kept": [], "missing": ["gpu03"]}
    # a hand-written line that is not a GUID list is not a record
    assert f.opensm_member_guids(failed, "# member gpu03: see ticket 42\n")["missing"] == ["gpu03"]
