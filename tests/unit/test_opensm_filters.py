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
