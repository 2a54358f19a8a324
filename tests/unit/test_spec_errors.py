"""Bad specs: every problem is reported, with the right rule, file, line and column, in one run."""

from __future__ import annotations

import textwrap

import pytest

from provisioner.spec import load_text

BASE = textwrap.dedent("""\
    cluster: {name: t, os: ubuntu-22.04}
    software:
      driver: {version: "550.90.07"}
      cuda: "12.4.1"
      nccl: "2.21.5"
      ofed: {flavor: doca, version: "2.9.1"}
    repositories:
      cuda: {url: "http://m/cuda", key: k.gpg}
      doca: {url: "http://m/doca", key: k.gpg}
    profiles:
      gpu8:
        gpu: {model: H100-SXM5-80GB, count: 8, nvswitch: true}
        hcas: [{device: "mlx5_[0-7]", rate: NDR}]
      svc:
        hcas: [{device: mlx5_0, rate: NDR}]
    nodes:
      - {name: "gpu[01-04]", address: "10.0.0.[11-14]", profile: gpu8}
      - {name: "sm[1-2]", address: "10.0.0.[2-3]", profile: svc, roles: [subnet_manager]}
    switches:
      - {name: leaf1, ports: 64, uplinks: 0}
    fabric:
      rate: NDR
      topology: {kind: single_switch}
      subnet_manager:
        nodes: [{node: sm1, priority: 15}, {node: sm2, priority: 14}]
    """)


def diags(text: str) -> list[tuple[str, int, int, str]]:
    res = load_text(text, "c.yaml")
    return [(d.rule, d.line, d.col, d.severity) for d in res.diagnostics]


def rules_of(text: str) -> set[str]:
    return {d.rule for d in load_text(text, "c.yaml").diagnostics}


def test_base_is_clean() -> None:
    assert diags(BASE) == []


def test_yaml_syntax_error_has_position() -> None:
    res = load_text("cluster: {name: t\nnodes: [\n", "c.yaml")
    assert [d.rule for d in res.diagnostics] == ["YAML-SYNTAX"]
    # the '{' left open on line 1 is the mistake; the parser only notices on line 2 (named in the message)
    assert res.diagnostics[0].format().startswith("c.yaml:1:10:")
    assert "at line 2" in res.diagnostics[0].message


def test_duplicate_key() -> None:
    text = BASE.replace('  nccl: "2.21.5"\n', '  nccl: "2.21.5"\n  nccl: "2.21.6"\n')
    assert ("YAML-DUPLICATE-KEY", 6, 3, "error") in diags(text)


def test_unknown_key_did_you_mean() -> None:
    text = BASE.replace("  svc:\n", "  svc:\n    managment_interface: eno1\n")
    res = load_text(text, "c.yaml")
    [d] = res.diagnostics
    assert (d.rule, d.line, d.col) == ("SPEC-UNKNOWN-KEY", 15, 5)
    assert "did you mean 'management_interface'" in d.hint


def test_unknown_top_level_key() -> None:
    res = load_text(BASE + "verfy: {}\n", "c.yaml")
    [d] = res.diagnostics
    assert d.rule == "SPEC-UNKNOWN-KEY" and "verify" in d.hint and d.line == 26


def test_several_schema_errors_in_one_run() -> None:
    text = BASE.replace('cuda: "12.4.1"', "cuda: 12.4").replace("os: ubuntu-22.04", "os: rhel-9")
    res = load_text(text, "c.yaml")
    assert {(d.rule, d.line) for d in res.diagnostics} == {("SPEC-SCHEMA", 1), ("SPEC-SCHEMA", 4)}
    assert any("quoted string" in d.message for d in res.diagnostics)


def test_missing_required() -> None:
    text = BASE.replace('  nccl: "2.21.5"\n', "")
    [d] = load_text(text, "c.yaml").diagnostics
    assert d.rule == "SPEC-MISSING" and "nccl" in d.message and d.line == 3


def test_bad_hostlist() -> None:
    text = BASE.replace('"gpu[01-04]"', '"gpu[04-01]"')
    assert ("SPEC-HOSTLIST", 17, 12, "error") in diags(text)


def test_range_length_mismatch() -> None:
    text = BASE.replace('"10.0.0.[11-14]"', '"10.0.0.[11-13]"')
    assert ("SPEC-RANGE-LENGTH", 17, 35, "error") in diags(text)


def test_duplicate_hostname_and_address() -> None:
    text = BASE.replace("  - {name: \"sm[1-2]\"",
                        "  - {name: gpu01, address: 10.0.0.99, profile: svc}\n"
                        "  - {name: x1, address: 10.0.0.11, profile: svc}\n"
                        "  - {name: \"sm[1-2]\"")
    got = diags(text)
    assert ("SPEC-DUP-HOST", 18, 12, "error") in got
    assert ("SPEC-DUP-ADDRESS", 19, 25, "error") in got


def test_duplicate_guid() -> None:
    text = BASE.replace('  - {name: "sm[1-2]", address: "10.0.0.[2-3]", profile: svc, roles: [subnet_manager]}\n',
                        "  - {name: sm1, address: 10.0.0.2, profile: svc, roles: [subnet_manager],\n"
                        "     guids: {mlx5_0: '0xa088c20300000001'}}\n"
                        "  - {name: sm2, address: 10.0.0.3, profile: svc, roles: [subnet_manager],\n"
                        "     guids: {mlx5_0: '0xA088C20300000001'}}\n")
    assert ("SPEC-DUP-GUID", 21, 22, "error") in diags(text)


def test_undefined_profile_node_switch() -> None:
    text = BASE.replace("profile: svc,", "profile: svx,").replace("{node: sm2, priority: 14}",
                                                                   "{node: sm9, priority: 14}")
    text = text.replace("topology: {kind: single_switch}",
                        "topology:\n    kind: single_switch\n    cabling:\n"
                        "      - {nodes: \"gpu[01-04]\", hca: mlx5_0, switch: leaf2, ports: 1-4}")
    res = load_text(text, "c.yaml")
    by_rule = {d.rule: d for d in res.diagnostics}
    assert by_rule["SPEC-UNDEFINED-PROFILE"].line == 18 and "svc" in by_rule["SPEC-UNDEFINED-PROFILE"].hint
    assert by_rule["SPEC-UNDEFINED-SWITCH"].line == 26 and "leaf1" in by_rule["SPEC-UNDEFINED-SWITCH"].hint
    assert by_rule["SM-NODE"].message.startswith("SM node 'sm9'")


def test_secret_inline_is_refused_without_echoing_it() -> None:
    text = BASE.replace("  - {name: leaf1, ports: 64, uplinks: 0}",
                        "  - {name: leaf1, address: 10.0.1.1, device_type: mellanox_mlnxos,\n"
                        "     credentials: {file: s.yml, password: hunter2}}")
    res = load_text(text, "c.yaml")
    [d] = res.diagnostics
    assert d.rule == "SPEC-SECRET-INLINE" and d.line == 21
    assert "hunter2" not in d.format()


def test_command_line_values_are_pattern_checked() -> None:
    text = BASE.replace('driver: {version: "550.90.07"}', 'driver: {version: "550; rm -rf /"}')
    [d] = load_text(text, "c.yaml").diagnostics
    assert d.rule == "SPEC-SCHEMA" and d.line == 3 and "not allowed" in d.message


def test_cable_port_used_twice_and_out_of_range() -> None:
    text = BASE.replace("topology: {kind: single_switch}",
                        "topology:\n    kind: single_switch\n    cabling:\n"
                        "      - {nodes: \"gpu[01-02]\", hca: mlx5_0, switch: leaf1, ports: 1-2}\n"
                        "      - {nodes: \"gpu[03-04]\", hca: mlx5_0, switch: leaf1, ports: \"[2,99]\"}")
    assert {"SPEC-DUP-CABLE", "SPEC-SWITCH-PORT"} <= rules_of(text)


# --- design rules ----------------------------------------------------------------------------------------------
def test_rail_per_gpu_warns_with_per_gpu_figure() -> None:
    text = BASE.replace('"mlx5_[0-7]"', '"mlx5_[0-1]"')
    res = load_text(text, "c.yaml")
    [d] = res.diagnostics
    assert d.rule == "RAIL-PER-GPU" and d.severity == "warning" and "100 Gb/s per GPU" in d.message


def test_oversubscription_warns_with_ratio() -> None:
    text = BASE.replace("  - {name: leaf1, ports: 64, uplinks: 0}",
                        "  - {name: leaf1, ports: 64, uplinks: 8}\n  - {name: spine1, tier: spine}")
    text = text.replace("topology: {kind: single_switch}",
                        "topology:\n    kind: fat_tree\n    cabling:\n"
                        "      - {nodes: \"gpu[01-04]\", hca: mlx5_0, switch: leaf1, ports: 1-4}\n"
                        "      - {nodes: \"gpu[01-04]\", hca: mlx5_1, switch: leaf1, ports: 5-8}\n"
                        "      - {nodes: \"gpu[01-04]\", hca: mlx5_2, switch: leaf1, ports: 9-12}\n"
                        "      - {nodes: \"gpu[01-04]\", hca: mlx5_3, switch: leaf1, ports: 13-16}")
    res = load_text(text, "c.yaml")
    over = [d for d in res.diagnostics if d.rule == "FAT-TREE-OVERSUB"]
    assert len(over) == 1 and "2.00:1" in over[0].message and over[0].line == 20


def test_single_sm_warns_and_equal_priority_errors() -> None:
    single = BASE.replace(", {node: sm2, priority: 14}", "")
    assert ("SM-SINGLE", 25, 12, "warning") in diags(single)
    tie = BASE.replace("{node: sm2, priority: 14}", "{node: sm2, priority: 15}")
    assert ("SM-PRIORITY-TIE", 25, 62, "error") in diags(tie)


def test_adaptive_routing_on_switch_sm_or_upstream_is_error() -> None:
    sw = BASE.replace("    nodes: [{node: sm1, priority: 15}, {node: sm2, priority: 14}]",
                      "    kind: switch\n    switch: leaf1\n    adaptive_routing: true")
    assert "SM-AR-UNSUPPORTED" in rules_of(sw)
    up = BASE.replace("    nodes: [", "    build: upstream\n    routing_engines: [ar_updn, updn]\n    nodes: [")
    assert "SM-AR-UNSUPPORTED" in rules_of(up)


def test_mixed_rates_in_a_rail() -> None:
    text = BASE.replace("hcas: [{device: mlx5_0, rate: NDR}]", "hcas: [{device: mlx5_0, rate: HDR}]")
    assert "RAIL-MIXED-RATE" in rules_of(text)


def test_roce_without_pfc_ecn_is_error() -> None:
    text = BASE.replace("  rate: NDR\n", "  type: roce\n  rate: 400\n").replace(
        "  subnet_manager:\n    nodes: [{node: sm1, priority: 15}, {node: sm2, priority: 14}]\n", "")
    assert "ROCE-NO-PFC-ECN" in rules_of(text)
    fixed = text + "  roce: {pfc_priority: 3, ecn: true}\n"
    assert "ROCE-NO-PFC-ECN" not in rules_of(fixed)


def test_pcie_gpu_with_nvswitch_is_error() -> None:
    text = BASE.replace("model: H100-SXM5-80GB", "model: H100-PCIE-80GB")
    assert ("GPU-PCIE-NVSWITCH", 12, 54, "error") in diags(text)


def test_unknown_gpu_model_suggests() -> None:
    res = load_text(BASE.replace("H100-SXM5-80GB", "H100-SXM-80GB"), "c.yaml")
    [d] = res.diagnostics
    assert d.rule == "SPEC-GPU-MODEL" and "H100-SXM5-80GB" in d.hint


def test_nccl_floor_above_rails_is_error() -> None:
    text = BASE + "verify:\n  nccl: {min_busbw_gbps: 450}\n"
    [d] = load_text(text, "c.yaml").diagnostics
    assert d.rule == "NCCL-FLOOR-UNREACHABLE" and "400 GB/s" in d.message
    assert load_text(BASE + "verify:\n  nccl: {min_busbw_gbps: 360}\n", "c.yaml").diagnostics == []


def test_nccl_floor_above_the_gpu_links_is_a_warning() -> None:
    """PCIe GPUs without NVLink: the rails carry 400 GB/s, the PCIe Gen5 hop between GPUs 63."""
    pcie = BASE.replace("model: H100-SXM5-80GB", "model: H100-PCIE-80GB").replace("nvswitch: true", "nvswitch: false")
    [d] = load_text(pcie + "verify:\n  nccl: {min_busbw_gbps: 100}\n", "c.yaml").diagnostics
    assert (d.rule, d.severity) == ("NCCL-FLOOR-ABOVE-EXPECTED", "warning")
    assert "above the expected 63 GB/s (PCIe Gen5 x16 between H100-PCIE-80GB GPUs)" in d.message
    assert load_text(pcie + "verify:\n  nccl: {min_busbw_gbps: 50}\n", "c.yaml").diagnostics == []


def test_more_nodes_than_leaf_ports() -> None:
    text = BASE.replace("{name: leaf1, ports: 64, uplinks: 0}", "{name: leaf1, ports: 8, uplinks: 6}")
    text = text.replace("topology: {kind: single_switch}",
                        "topology:\n    kind: single_switch\n    cabling:\n"
                        "      - {nodes: \"gpu[01-04]\", hca: mlx5_0, switch: leaf1, ports: 1-4}")
    assert "LEAF-PORTS-EXCEEDED" in rules_of(text)


def test_partition_rules() -> None:
    text = BASE + ("  partitions:\n    - {name: a, pkey: 0x8001, members: \"gpu[01-02]\"}\n"
                   "    - {name: b, pkey: 0x0001, members: \"gpu[03-09]\"}\n"
                   "    - {name: c, pkey: 0x7fff, members: gpu01}\n")
    got = rules_of(text)
    assert {"PKEY", "SPEC-UNDEFINED-NODE"} <= got


@pytest.mark.parametrize("text", ["", "---\n", "[]\n", "just a string\n", "cluster: 3\n", "\x00\x01"])
def test_degenerate_documents_give_clean_errors(text: str) -> None:
    res = load_text(text, "c.yaml")
    assert res.cluster is None and res.errors


def test_schema_errors_do_not_hide_the_other_problems() -> None:
    # node group 0 has a bad key (set aside); group 1 still gets its range-length error at ITS line,
    # and the SM tie is still found
    text = BASE.replace('  - {name: "gpu[01-04]", address: "10.0.0.[11-14]", profile: gpu8}',
                        '  - {name: "gpu[01-04]", address: "10.0.0.[11-14]", profile: gpu8, rack: 7}\n'
                        '  - {name: "gpu[05-06]", address: "10.0.0.[15-17]", profile: gpu8}')
    text = text.replace("{node: sm2, priority: 14}", "{node: sm2, priority: 15}")
    got = {(d.rule, d.line) for d in load_text(text, "c.yaml").diagnostics}
    assert ("SPEC-UNKNOWN-KEY", 17) in got
    assert ("SPEC-RANGE-LENGTH", 18) in got
    assert ("SM-PRIORITY-TIE", 26) in got


def test_cuda_needs_its_driver() -> None:
    old = BASE.replace('driver: {version: "550.90.07"}', 'driver: {version: "535.104.05"}')
    [d] = load_text(old, "c.yaml").diagnostics
    assert (d.rule, d.severity, d.line) == ("COMPAT-CUDA-DRIVER", "warning", 3)
    assert "550.54.15" in d.message and "minor-version" in d.message
    ancient = BASE.replace('driver: {version: "550.90.07"}', 'driver: {version: "470.256.02"}')
    got = {(d.rule, d.severity) for d in load_text(ancient, "c.yaml").diagnostics}
    assert ("COMPAT-CUDA-DRIVER", "error") in got
    assert ("COMPAT-GPU-DRIVER", "error") in got  # H100 needs branch 525+


def test_os_repository_has_no_such_cuda() -> None:
    text = BASE.replace("os: ubuntu-22.04", "os: ubuntu-24.04")
    [d] = load_text(text, "c.yaml").diagnostics
    assert d.rule == "COMPAT-OS-CUDA" and d.line == 4


def test_blackwell_needs_open_modules() -> None:
    text = BASE.replace('driver: {version: "550.90.07"}',
                        'driver: {version: "570.124.06", kernel_modules: proprietary}').replace(
        "H100-SXM5-80GB", "B200-SXM-180GB")
    assert ("COMPAT-GPU-DRIVER", 3, 51, "error") in diags(text)


def test_a_catalog_model_whose_stack_no_role_installs_is_refused_naming_what_is_missing() -> None:
    text = BASE.replace('driver: {version: "550.90.07"}', 'driver: {version: "570.133.20", kernel_modules: open}'
                        ).replace("H100-SXM5-80GB", "B200-SXM-180GB")
    [d] = [d for d in load_text(text, "c.yaml").diagnostics if d.rule == "GPU-STACK-MISSING"]
    assert d.severity == "error" and "NVLink Subnet Manager (nvlsm)" in d.message and "no role installs" in d.message
    assert "GPU-STACK-MISSING" not in rules_of(BASE)  # H100 HGX: fabric manager alone trains its NVSwitches


def test_leaf_uplinks_beyond_spine_ports() -> None:
    two_tier = BASE.replace("{name: leaf1, ports: 64, uplinks: 0}",
                            "{name: leaf1, ports: 64, uplinks: 32}\n  - {name: \"spine[1-2]\", tier: spine, ports: 15}")
    [d] = [d for d in load_text(two_tier, "c.yaml").diagnostics if d.rule == "TIER-PORTS-EXCEEDED"]
    assert d.severity == "error" and "32 uplinks" in d.message and "only 30 ports" in d.message
    assert "TIER-PORTS-EXCEEDED" not in rules_of(two_tier.replace("ports: 15}", "ports: 16}"))


def test_doca_release_outside_the_ofed_table_warns_unless_site_says() -> None:
    old = BASE.replace('version: "2.9.1"}', 'version: "2.7.0"}')
    [d] = [d for d in load_text(old, "c.yaml").diagnostics if d.rule == "COMPAT-DOCA-UNKNOWN"]
    assert d.severity == "warning" and "DOCA 2.7.0" in d.message and "doca_ofed_ofed_version" in d.hint
    told = old + "site_vars:\n  doca_ofed_ofed_version: \"24.04-0.6.6.0\"\n"
    assert "COMPAT-DOCA-UNKNOWN" not in rules_of(told)


def test_one_cause_is_one_line_for_the_whole_range() -> None:
    """A range cabled to devices its profile lacks: one line per cabling entry naming gpu[01-08], not one
    per node (an 8-node spec whose profile was cut to 2 HCAs printed 48 lines for 6 causes)."""
    text = BASE.replace('"mlx5_[0-7]"', '"mlx5_[0-1]"').replace('"gpu[01-04]", address: "10.0.0.[11-14]"',
                                                                 '"gpu[01-08]", address: "10.0.0.[11-18]"')
    text = text.replace("  - {name: leaf1, ports: 64, uplinks: 0}\n", "".join(
        f"  - {{name: rail{i}, ports: 64, uplinks: 0}}\n" for i in range(8)))
    cabling = "".join(f'        - {{nodes: "gpu[01-08]", hca: mlx5_{i}, switch: rail{i}, ports: 1-8}}\n'
                      for i in range(8))
    text = text.replace("  topology: {kind: single_switch}\n",
                        f"  topology:\n    kind: rail_optimized\n    cabling:\n{cabling}")
    text = text.replace("        - {", "      - {")
    res = load_text(text, "c.yaml")
    undefined = [d for d in res.diagnostics if d.rule == "SPEC-UNDEFINED-DEVICE"]
    assert [d.message for d in undefined] == [
        f"gpu[01-08] has no device mlx5_{i} in its profile" for i in range(2, 8)], [d.format() for d in undefined]
    assert len({d.line for d in undefined}) == 6  # each points at its own cabling line


def test_only_the_hosts_that_share_a_cause_are_folded() -> None:
    """Two nodes of a range out of the profile: the other nodes stay unnamed; two different rules stay two."""
    text = BASE.replace("    hcas: [{device: mlx5_0, rate: NDR}]\n",
                        "    hcas: [{device: mlx5_0, rate: NDR}]\n  odd:\n"
                        "    hcas: [{device: mlx5_1, rate: NDR}]\n")
    text = text.replace('  - {name: "gpu[01-04]", address: "10.0.0.[11-14]", profile: gpu8}\n',
                        '  - {name: "gpu[01-04]", address: "10.0.0.[11-14]", profile: gpu8}\n'
                        '  - {name: "x[7-8]", address: "10.0.0.[7-8]", profile: odd}\n')
    text = text.replace("  topology: {kind: single_switch}\n",
                        "  topology:\n    kind: single_switch\n    cabling:\n"
                        '      - {nodes: "gpu01,x[7-8]", hca: mlx5_0, switch: leaf1, ports: 1-3}\n')
    res = load_text(text, "c.yaml")
    undefined = [d.message for d in res.diagnostics if d.rule == "SPEC-UNDEFINED-DEVICE"]
    assert undefined == ["x[7-8] has no device mlx5_0 in its profile"], undefined


DMABUF = BASE + "gpudirect: {mode: dmabuf}\n"


def test_dmabuf_with_open_modules_on_hopper_is_clean() -> None:
    assert load_text(DMABUF, "c.yaml").diagnostics == []


def test_dmabuf_with_proprietary_modules_is_an_error_at_the_mode() -> None:
    text = DMABUF.replace('driver: {version: "550.90.07"}',
                          'driver: {version: "550.90.07", kernel_modules: proprietary}')
    [d] = load_text(text, "c.yaml").diagnostics
    assert (d.rule, d.severity, d.line, d.col) == ("GPUDIRECT-DMABUF", "error", 26, 19)
    assert "open kernel modules" in d.message and "kernel_modules: open" in d.hint


def test_dmabuf_on_volta_or_with_old_cuda_nccl_driver_is_an_error() -> None:
    volta = DMABUF.replace("H100-SXM5-80GB, count: 8", "V100-SXM2-32GB, count: 8").replace(
        'driver: {version: "550.90.07"}', 'driver: {version: "550.90.07", kernel_modules: proprietary}')
    msgs = [d.message for d in load_text(volta, "c.yaml").diagnostics if d.rule == "GPUDIRECT-DMABUF"]
    assert any("V100-SXM2-32GB (profile 'gpu8') is Volta" in m for m in msgs)
    old = DMABUF.replace('nccl: "2.21.5"', 'nccl: "2.12.12"').replace('cuda: "12.4.1"', 'cuda: "11.6.2"').replace(
        'driver: {version: "550.90.07"}', 'driver: {version: "510.108.03"}')
    msgs = [d.message for d in load_text(old, "c.yaml").diagnostics if d.rule == "GPUDIRECT-DMABUF"]
    assert any("NCCL 2.12.12" in m and "2.13" in m for m in msgs)
    assert any("CUDA 11.6.2" in m and "11.7" in m for m in msgs)
    assert any("driver branch 510" in m and "515" in m for m in msgs)
    assert "GPUDIRECT-DMABUF" not in rules_of(old.replace("gpudirect: {mode: dmabuf}\n", ""))


def test_open_modules_do_not_drive_volta() -> None:
    volta = BASE.replace("H100-SXM5-80GB, count: 8", "V100-SXM2-32GB, count: 8")
    assert ("COMPAT-GPU-DRIVER", 3, 50, "error") in diags(volta.replace(
        'driver: {version: "550.90.07"}', 'driver: {version: "550.90.07", kernel_modules: open}'))
    assert "COMPAT-GPU-DRIVER" not in rules_of(volta.replace(
        'driver: {version: "550.90.07"}', 'driver: {version: "550.90.07", kernel_modules: proprietary}'))


def test_single_node_floor_above_the_nvlink_figure_is_a_warning() -> None:
    """H100-SXM5: NVLink 450 GB/s per GPU; a single-node floor above it warns, at its line, naming the figure."""
    [d] = load_text(BASE + "verify:\n  nccl: {min_single_node_busbw_gbps: 500}\n", "c.yaml").diagnostics
    assert (d.rule, d.severity) == ("NCCL-NODE-FLOOR-ABOVE-EXPECTED", "warning")
    assert d.message == ("single-node NCCL floor 500 GB/s is above the expected 450 GB/s of gpu01 "
                         "(NVLink 450 GB/s per H100-SXM5-80GB)")
    assert load_text(BASE + "verify:\n  nccl: {min_single_node_busbw_gbps: 350}\n", "c.yaml").diagnostics == []
