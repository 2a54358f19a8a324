"""provisioner: racked GPU servers to a verified InfiniBand fabric from one file."""

__version__ = "0.1.0"
