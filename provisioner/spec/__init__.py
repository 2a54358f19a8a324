"""The cluster spec: models, YAML loading with positions, hostlists, expansion and design rules."""

from provisioner.spec.cluster import Cluster, Node, Port
from provisioner.spec.diagnostics import Diagnostic
from provisioner.spec.load import LoadResult, load_cluster, load_spec, load_text

__all__ = ["Cluster", "Diagnostic", "LoadResult", "Node", "Port", "load_cluster", "load_spec", "load_text"]
