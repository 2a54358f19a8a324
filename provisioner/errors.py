"""The one exception root of the library, mapped to exit codes at the CLI edge."""

from __future__ import annotations


class ProvisionerError(Exception):
    """Base of every error the CLI turns into a clean message and an exit code."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(ProvisionerError):
    """The command line or an input file cannot be used as given."""

    exit_code = 2


class SpecInvalid(ProvisionerError):
    """The cluster spec has errors; `diagnostics` holds every one of them."""

    exit_code = 1

    def __init__(self, diagnostics: list[object]) -> None:
        super().__init__(f"{len(diagnostics)} problem(s) in the cluster spec")
        self.diagnostics = diagnostics


class ParseError(ProvisionerError):
    """A text given to a parser is not that tool's output."""

    exit_code = 2


class LabError(ProvisionerError):
    """The lab (containers, image, network) could not do what was asked."""

    exit_code = 2


class RemoteError(ProvisionerError):
    """A node could not be reached or a remote command failed to run."""

    exit_code = 2
