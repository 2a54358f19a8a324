"""Variable names site data may not set: Ansible's own and the ones the tool renders from the spec.

`site_vars` (in the spec or an overlay) exist to override a role's tunables (preflight_gpu_evidence,
nfs_client_require_kernel_nfs, ...). They must never become connection settings or code: `ansible_*` names
are connection and interpreter settings (`ansible_ssh_args: -oStrictHostKeyChecking=no`,
`ansible_connection: local` running node tasks as root on the control machine, `ansible_python_interpreter`),
Ansible's magic and keyword names change what a play is, and a name the tool renders from the spec
(`nvidia_driver_version`, `opensm_partitions`, ...) would silently contradict the spec that validated.

OWNED_VARS must list every variable provisioner.render.model.build_inventory writes; tests/unit/
test_site_data_safety.py checks it against the inventories of every example spec.
"""

from __future__ import annotations

RESERVED_PREFIXES: tuple[str, ...] = ("ansible_", "provisioner_")
"""Connection/interpreter/magic variables (Ansible), and the tool's own namespace."""

ANSIBLE_MAGIC_VARS = frozenset({
    # https://docs.ansible.com/ansible/latest/reference_appendices/special_variables.html (non ansible_* ones)
    "groups", "group_names", "hostvars", "inventory_dir", "inventory_file", "inventory_hostname",
    "inventory_hostname_short", "omit", "play_hosts", "playbook_dir", "role_name", "role_names", "role_path",
    "environment", "item", "vars",
})

ANSIBLE_RESERVED_NAMES = frozenset({
    # ansible.vars.reserved.get_reserved_names() of ansible-core 2.19 (play, role, block and task keywords)
    "action", "always", "any_errors_fatal", "args", "async", "async_val", "become", "become_exe", "become_flags",
    "become_method", "become_user", "block", "changed_when", "check_mode", "collections", "connection", "cycler",
    "debugger", "delay", "delegate_facts", "delegate_to", "dict", "diff", "environment", "fact_path", "failed_when",
    "force_handlers", "gather_facts", "gather_timeout", "handlers", "hosts", "ignore_errors", "ignore_unreachable",
    "joiner", "lipsum", "local_action", "lookup", "loop", "loop_control", "loop_with", "max_fail_percentage",
    "module_defaults", "name", "namespace", "no_log", "notify", "now", "omit", "order", "poll", "port",
    "post_tasks", "pre_tasks", "q", "query", "range", "register", "remote_user", "rescue", "retries", "roles",
    "run_once", "serial", "strategy", "tags", "tasks", "throttle", "timeout", "undef", "until", "vars",
    "vars_files", "vars_prompt", "when", "with_",
})

OWNED_VARS = frozenset({
    # rendered from the spec by provisioner.render.model (ansible_* and provisioner_* are covered by prefix)
    "cuda_version", "dcgm_version", "doca_ofed_flavor", "doca_ofed_version", "lustre_client_mounts",
    "lustre_client_version", "nccl_conf", "nccl_tests_version", "nccl_version", "nfs_client_mounts",
    "nfs_server_exports",
    "nvidia_driver_branch", "nvidia_driver_enabled", "nvidia_driver_fabric_manager", "nvidia_driver_kernel_modules",
    "nvidia_driver_version", "nvidia_peermem_enabled", "opensm_adaptive_routing", "opensm_build",
    "opensm_default_partition", "opensm_device", "opensm_handover", "opensm_kind", "opensm_partition_memberships",
    "opensm_partitions", "opensm_port", "opensm_priority", "opensm_routing_engines", "preflight_gpu_count",
    "preflight_gpu_model", "preflight_hca_devices", "roce_qos_dscp", "roce_qos_ecn", "roce_qos_enabled",
    "roce_qos_mtu", "roce_qos_pfc_priority", "roce_qos_ports", "roce_qos_tos", "roce_qos_trust",
    "vendor_repos_cuda", "vendor_repos_doca", "vendor_repos_offline", "vendor_repos_os",
    "ipoib_interfaces", "lustre_client_built_against_ofed", "nccl_ib_pkey", "nccl_topo_file",
    "nfs_client_rdma_packages", "nfs_server_rdma", "nfs_server_rdma_packages", "nvidia_driver_allow_reboot",
    "opensm_default_partition_ipoib_mtu", "perftest_cuda_enabled", "perftest_cuda_version", "slurm_enabled",
    "slurm_controller", "slurm_controller_address", "slurm_nodes", "slurm_partitions", "slurm_spares", "slurm_failed",
    "slurm_gres", "slurm_min_version", "slurm_cgroup_conf", "slurm_boot_parameters", "vendor_repos_slurm",
    "slurm_topology_conf", "slurm_accounting_host", "slurm_accounting_address", "vendor_repos_nhc", "slurm_nhc",
    "slurm_nhc_conf", "preflight_mok_key", "preflight_mok_cert", "host_tuning_ntp_servers",
    "doca_ofed_firmware_mirror", "doca_ofed_firmware_pins", "doca_ofed_mlxconfig_settings", "manifest_mlxconfig_keys",
    "preflight_firmware_pins", "preflight_firmware_mirror", "vendor_repos_containers", "containers_toolkit_version",
    "containers_enroot_version", "containers_enroot_mirror", "containers_pyxis_version", "containers_pyxis_source",
    "containers_scratch",
})


def why_reserved(name: str) -> str | None:
    """Why site data may not set `name`, or None when it may."""
    if name.startswith("ansible_"):
        return "ansible_* variables are connection, privilege and interpreter settings"
    if name.startswith("provisioner_") or name in OWNED_VARS:
        return "the tool renders it from the spec; change the spec key instead"
    if name in ANSIBLE_MAGIC_VARS or name in ANSIBLE_RESERVED_NAMES:
        return "an Ansible magic variable or keyword"
    return None


class ReservedName(ValueError):
    """A site variable name that site data may not set (the loader reports it as SPEC-RESERVED-VAR)."""
