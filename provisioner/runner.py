"""Run one playbook through ansible-runner and boil its event stream down to a per-host outcome.

This is the only module that imports `ansible_runner`. Everything else sees `PlaybookResult`: per host the
ok/changed/failed/unreachable/skipped counts, and for a host that failed or could not be reached, the task
that did it and Ansible's message. The phase engine (`provisioner.phases`) decides what to do with that.

Why the care around artifacts: ansible-runner records the whole process environment (`command`), every
event with its task results (`job_events/`) and the full stdout under the artifact directory, and we keep
those under the state dir for people to read after a failed run. Secrets must not end up there. So:
secrets only reach Ansible as vars *files* named on the command line (`-e @file`), never as environment or
extra-vars values; `suppress_env_files` keeps runner from copying anything into `env/`; `no_log` is left to
Ansible (the callback plugin censors those results); each event is redacted in place before runner writes
it; and after the run every artifact file is scrubbed for the registered secret values, and the recorded
environment is cut down to an allow-list.
"""

from __future__ import annotations

import configparser
import io
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from provisioner import interrupt
from provisioner.collection import collections_root, require_playbook, roles_dir
from provisioner.errors import ProvisionerError, UsageError
from provisioner.quiet_warnings import pythonwarnings
from provisioner.render.ssh import ssh_rewrites
from provisioner.spec.yamlload import check_depth
from provisioner.state import make_files_private, private_dir
from provisioner.userfile import read_user_text

REDACTED = "********"
MIN_SECRET_LEN = 4  # shorter values would shred the artifacts when scrubbed; vault files hold real secrets
DEFAULT_FORKS = 25
CONTROL_PERSIST_S = 60
SERVER_ALIVE_S = 10
SERVER_ALIVE_COUNT = 3
"""A node silent over SSH for SERVER_ALIVE_S * SERVER_ALIVE_COUNT seconds is unreachable (even mid-task)."""
# unix sockets are limited to 108 bytes; ansible appends a 10-character hash to the directory
_MAX_CONTROL_DIR_LEN = 80
# environment variables kept in the recorded `command` artifact (everything else from the caller's
# environment is dropped: it may hold tokens that ansible never needed)
_ENV_KEEP_PREFIXES = ("ANSIBLE_", "AWX_", "RUNNER_")
_ENV_KEEP = frozenset({"PATH", "HOME", "LANG", "LC_ALL", "USER", "PYTHONPATH", "VIRTUAL_ENV", "SHELL", "TERM"})

_TEMPLATE_MARKS = ("{{", "{%", "{#")
"""Where Jinja starts: extra vars go to ansible as trusted JSON on the command line, so they may hold none."""

_DEFAULT_COLLECTIONS_PATH = ("~/.ansible/collections", "/usr/share/ansible/collections")  # ansible-core's default

EventHandler = Callable[[dict[str, Any]], None]


class RunnerError(ProvisionerError):
    """ansible-playbook could not run the playbook at all (syntax error, bad inventory, missing binary)."""

    exit_code = 2


@dataclass
class HostStatus:
    """What one playbook run did on one host."""

    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0
    failed_task: str | None = None
    message: str | None = None

    @property
    def state(self) -> str:
        """`unreachable`, `failed` or `ok`: unreachable wins, since nothing after it ran."""
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        return "ok"

    @property
    def reason(self) -> str:
        """One line for a person: the task and Ansible's message."""
        if self.state == "ok":
            return ""
        task = f"task '{self.failed_task}'" if self.failed_task else "a task"
        return f"{self.state} at {task}: {self.message or 'no message'}"

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "state": self.state, "ok": self.ok, "changed": self.changed,
                "failed": self.failed, "unreachable": self.unreachable, "skipped": self.skipped,
                "rescued": self.rescued, "ignored": self.ignored, "failed_task": self.failed_task,
                "message": self.message}


@dataclass
class PlaybookResult:
    """The outcome of one playbook run: runner's status, rc, per-host statuses, where the artifacts are."""

    playbook: str
    status: str
    rc: int
    hosts: dict[str, HostStatus]
    artifact_dir: Path | None
    error: str | None = None  # set when the run produced no per-host result (the whole playbook failed)

    def hosts_in(self, state: str) -> list[str]:
        return [h for h, s in self.hosts.items() if s.state == state]

    @property
    def ok_hosts(self) -> list[str]:
        return self.hosts_in("ok")

    @property
    def failed_hosts(self) -> list[str]:
        return self.hosts_in("failed")

    @property
    def unreachable_hosts(self) -> list[str]:
        return self.hosts_in("unreachable")


# ---------------------------------------------------------------------------------------------------------
# events -> per-host status (pure)

_COUNTER_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_skipped": "skipped",
    "runner_on_unreachable": "unreachable",
}


def _event_message(res: Any) -> str:
    """Ansible's failure text from a task result: `msg`, else stderr, else the module's exception line."""
    if not isinstance(res, Mapping):
        return str(res) if res else ""
    items = [i for i in res.get("results") or [] if isinstance(i, Mapping) and (i.get("failed") or
                                                                                   i.get("unreachable"))]
    if items:  # a loop: Ansible's own msg is only "One or more items failed"; the first item says why
        first = _event_message(items[0]).splitlines()
        more = f" (and {len(items) - 1} more item(s))" if len(items) > 1 else ""
        return (first[0] if first else "an item failed") + more
    for key in ("msg", "stderr", "module_stderr", "exception", "reason"):
        val = res.get(key)
        text = str(val).strip() if val else ""
        if text and not (key == "exception" and text == "(traceback unavailable)"):
            return text.splitlines()[-1] if key in ("exception", "module_stderr") else text
    if res.get("attempts"):  # an `until:` loop that ran out: ansible-core gives no msg, only the last result
        out = str(res.get("stdout") or "").strip().splitlines()
        return (f"still not done after {res['attempts']} attempts"
                + (f" (last output: {out[-1].strip()[:200]})" if out else ""))
    return ""


class HostTally:
    """Folds runner events into `HostStatus` records. `playbook_on_stats` is the authority for counts."""

    def __init__(self) -> None:
        self.hosts: dict[str, HostStatus] = {}
        self.saw_stats = False

    def _host(self, name: str) -> HostStatus:
        if name not in self.hosts:
            self.hosts[name] = HostStatus(name)
        return self.hosts[name]

    def feed(self, event: Mapping[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind == "playbook_on_stats":
            self._stats(data)
            return
        host = data.get("host")
        if not host:
            return
        hs = self._host(str(host))
        if kind in ("runner_on_failed", "runner_on_async_failed"):
            if data.get("ignore_errors"):
                hs.ignored += 1
                return
            hs.failed += 1
            # the latest failure names the task: an earlier one was rescued (the host went on to fail later)
            hs.failed_task = data.get("task")
            hs.message = _event_message(data.get("res"))
        elif kind == "runner_on_unreachable":
            hs.unreachable += 1
            hs.failed_task = data.get("task")
            hs.message = _event_message(data.get("res")) or "host unreachable"
        elif kind in _COUNTER_EVENTS:
            attr = _COUNTER_EVENTS[kind]
            setattr(hs, attr, getattr(hs, attr) + 1)
            if kind == "runner_on_ok" and isinstance(data.get("res"), Mapping) and data["res"].get("changed"):
                hs.changed += 1

    def _stats(self, data: Mapping[str, Any]) -> None:
        """Counts from the play recap, for every host, 0 where a key leaves the host out.

        The events alone overcount: a task with ``ignore_unreachable`` still sends ``runner_on_unreachable``
        for the host that ran it (the SM node whose delegated read of a paused member failed), while the
        recap counts it ok + ignored, not dark, and the play went on for that host."""
        self.saw_stats = True
        fields = {"ok": "ok", "changed": "changed", "failures": "failed", "dark": "unreachable",
                  "skipped": "skipped", "rescued": "rescued", "ignored": "ignored"}
        for host in {*(data.get("processed") or {}), *(h for key in fields for h in data.get(key) or {})}:
            self._host(str(host))
        for name, hs in self.hosts.items():
            for stat_key, attr in fields.items():
                setattr(hs, attr, int((data.get(stat_key) or {}).get(name, 0)))
            if not hs.failed and not hs.unreachable:
                hs.failed_task = None
                hs.message = None


def summarize_events(events: Iterable[Mapping[str, Any]]) -> dict[str, HostStatus]:
    """Per-host status from a sequence of runner events (what `run_playbook` does while the run goes)."""
    tally = HostTally()
    for ev in events:
        tally.feed(ev)
    return tally.hosts


# ---------------------------------------------------------------------------------------------------------
# secrets and redaction (pure)

def secret_values(data: Any) -> set[str]:
    """Every scalar leaf of a vars structure, as text: the values of a secrets file are all secret."""
    out: set[str] = set()
    if isinstance(data, Mapping):
        for v in data.values():
            out |= secret_values(v)
    elif isinstance(data, list | tuple):
        for v in data:
            out |= secret_values(v)
    elif data is not None and not isinstance(data, bool):
        text = str(data)
        if len(text) >= MIN_SECRET_LEN:
            out.add(text)
    return out


def read_secret_file(path: Path) -> set[str]:
    """The values of a plain YAML secrets file. A vault-encrypted file yields none (its text is not secret)."""
    text = read_user_text(path, "a secrets file")
    if text.lstrip().startswith("$ANSIBLE_VAULT"):
        return set()
    try:
        check_depth(text)  # PyYAML's composer recurses: a deeply nested file would end in RecursionError
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"{_yaml_error_place(path, text, exc)}: the secrets file is not YAML: "
                         f"{_yaml_error_what(exc)}") from None
    return secret_values(data)


_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")


def _yaml_error_place(path: Path, text: str, exc: yaml.YAMLError) -> str:
    """``file:line:col`` of a YAML error: where the construct began for an unclosed quote or bracket (noticed only
    at the end of the file), else where the parser gave up."""
    if isinstance(exc, yaml.MarkedYAMLError):
        cm, pm = exc.context_mark, exc.problem_mark
        m = cm if cm is not None and exc.context and not exc.context.startswith("while parsing a block") else pm
        return f"{path}:{m.line + 1}:{m.column + 1}" if m is not None else str(path)
    if isinstance(exc, yaml.reader.ReaderError):
        before = text[: exc.position]
        return f"{path}:{before.count(chr(10)) + 1}:{exc.position - (before.rfind(chr(10)) + 1) + 1}"
    return str(path)


def _yaml_error_what(exc: yaml.YAMLError) -> str:
    """The problem in PyYAML's words without the file's text: PyYAML's own message quotes the offending line
    (in a secrets file, the secret) and some problems quote a token; those are cut out."""
    if isinstance(exc, yaml.MarkedYAMLError):
        said = ": ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
        m, cm = exc.problem_mark, exc.context_mark
        if m is not None and cm is not None and m.line != cm.line:
            said += f" (at line {m.line + 1})"
        return _QUOTED.sub("'…'", said)
    if isinstance(exc, yaml.reader.ReaderError):
        return "a character YAML does not allow (binary data or a wrong encoding?)"
    return type(exc).__name__


def _variants(secret: str) -> list[str]:
    """The secret as it may appear in artifacts: raw, JSON-escaped, repr-escaped. Longest first."""
    forms = {secret, json.dumps(secret)[1:-1], repr(secret)[1:-1]}
    return sorted(forms, key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """`text` with every occurrence of each secret (in its escaped forms too) replaced by REDACTED."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        if len(secret) < MIN_SECRET_LEN:
            continue
        for form in _variants(secret):
            text = text.replace(form, REDACTED)
    return text


def redact_obj(obj: Any, secrets: frozenset[str]) -> Any:
    """A copy of a JSON-like structure with secrets redacted in every string, keys included."""
    if not secrets:
        return obj
    if isinstance(obj, str):
        return redact_text(obj, secrets)
    if isinstance(obj, Mapping):
        return {redact_text(str(k), secrets): redact_obj(v, secrets) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact_obj(v, secrets) for v in obj]
    return obj


def filter_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment cut down to what explains the run: ANSIBLE_*/runner variables and a few basics."""
    return {k: v for k, v in env.items() if k in _ENV_KEEP or k.startswith(_ENV_KEEP_PREFIXES)}


def scrub_artifacts(artifact_dir: Path, secrets: Iterable[str]) -> list[Path]:
    """Redact every file under `artifact_dir` in place; cut the recorded env down. Returns files changed."""
    secret_set = frozenset(s for s in secrets if len(s) >= MIN_SECRET_LEN)
    changed: list[Path] = []
    if not artifact_dir.is_dir():
        return changed
    for path in sorted(p for p in artifact_dir.rglob("*") if p.is_file() and not p.is_symlink()):
        try:
            raw = path.read_bytes()
        except OSError:
            continue
        text = raw.decode("utf-8", errors="surrogateescape")
        new = text
        if path.name == "command":
            try:
                doc = json.loads(text)
            except ValueError:
                doc = None
            if isinstance(doc, dict) and isinstance(doc.get("env"), dict):
                doc["env"] = filter_env(doc["env"])
                new = json.dumps(doc, ensure_ascii=False)
        new = redact_text(new, secret_set)
        if new != text:
            path.write_bytes(new.encode("utf-8", errors="surrogateescape"))
            changed.append(path)
    return changed


# ---------------------------------------------------------------------------------------------------------
# per-run ansible configuration (pure)

def control_path_dir(state_dir: Path) -> Path:
    """Where SSH keeps its multiplexing sockets: the state dir if short enough, else ~/.ansible/cp."""
    cand = state_dir.resolve() / "cp"
    if len(str(cand)) <= _MAX_CONTROL_DIR_LEN:
        return cand
    return Path.home() / ".ansible" / "cp"


def ansible_state_dir(state_dir: Path) -> Path:
    """The state directory, resolved, if ansible.cfg and ssh read it back as written; else a one-line UsageError.

    ansible-core reads ansible.cfg with ``ConfigParser(inline_comment_prefixes=(';',))``: a ``;`` after a space
    starts a comment (the fact cache went to the directory above) and a newline another line. The control path
    directory reaches ssh inside ansible's ``ControlPath="<dir>/<hash>"``, where ssh reads ``%``, ``${``, ``"``
    and ``\\`` as its own (:func:`provisioner.render.ssh.ssh_rewrites`)."""
    path = state_dir.resolve()
    bad = ";" if ";" in str(path) else ssh_rewrites(str(path))
    if bad is not None:
        raise UsageError(f"the state directory {str(path)!r} has {bad!r}, which ansible.cfg or ssh would not read "
                         "as part of a path",
                         hint="give --out a directory whose path has no ;, %, ${, double quote, backslash or "
                              "control character")
    return path


def ansible_settings(state_dir: Path, *, forks: int, roles_path: Path | None = None) -> dict[str, dict[str, str]]:
    """The ansible.cfg sections for one run: why each setting is there is said next to it."""
    state_dir = ansible_state_dir(state_dir)
    return {
        "defaults": {
            # the package's roles (provisioner.collection), run as plain roles with the plugins they carry
            "roles_path": str(roles_path or roles_dir()),
            "forks": str(forks),
            "host_key_checking": "True",        # never accept an unknown host key
            "retry_files_enabled": "False",
            "gathering": "smart",               # gather once, then from the cache
            "fact_caching": "jsonfile",
            "fact_caching_connection": str(state_dir.resolve() / "facts"),
            "fact_caching_timeout": "86400",
            "interpreter_python": "auto_silent",
            "nocows": "True",
        },
        "ssh_connection": {
            "pipelining": "True",               # one SSH round trip per task instead of three
            # ServerAlive: a node that hangs mid-task (kernel stall, frozen container) answers TCP but never SSH;
            # without it the task waits on the shared control connection forever instead of going unreachable
            "ssh_args": f"-o ControlMaster=auto -o ControlPersist={CONTROL_PERSIST_S}s "
                        f"-o ServerAliveInterval={SERVER_ALIVE_S} -o ServerAliveCountMax={SERVER_ALIVE_COUNT} "
                        "-o StrictHostKeyChecking=yes",
            "control_path_dir": str(control_path_dir(state_dir)),
        },
    }


def collections_path_env(environ: Mapping[str, str]) -> dict[str, str]:
    """ANSIBLE_COLLECTIONS_PATH(S) as the caller set them, less this package's own collections directory.

    A playbook inside a configured collections path runs *in* that collection: its roles then load as collection
    roles, which do not get the filter and module plugins they carry (roles/*/filter_plugins, roles/*/library), and
    a phase fails on "couldn't resolve module/action". `provision collection-path` tells people to export that
    directory (for the inventory plugin), so the runs must not inherit it."""
    ours = {collections_root().resolve(), (collections_root() / "ansible_collections").resolve()}
    out: dict[str, str] = {}
    for var in ("ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_COLLECTIONS_PATHS"):
        if var in environ:
            kept = [p for p in environ[var].split(os.pathsep) if p and Path(p).expanduser().resolve() not in ours]
            out[var] = os.pathsep.join(kept or _DEFAULT_COLLECTIONS_PATH)
    return out


def render_ansible_cfg(settings: Mapping[str, Mapping[str, str]]) -> str:
    cp = configparser.ConfigParser(interpolation=None)
    for section, values in settings.items():
        cp[section] = dict(values)
    buf = io.StringIO()
    buf.write("# Written by provisioner for one run; see provisioner/runner.py for why each setting is set.\n")
    cp.write(buf)
    return buf.getvalue()


def build_cmdline(*, check: bool, diff: bool, secret_files: Iterable[Path], vault_password_file: Path | None) -> str:
    """ansible-playbook options runner has no keyword for. Paths only: never a secret value."""
    import shlex

    parts: list[str] = []
    if check:
        parts.append("--check")
    if diff:
        parts.append("--diff")
    for vf in secret_files:
        parts += ["-e", "@" + str(Path(vf).resolve())]
    if vault_password_file is not None:
        parts += ["--vault-password-file", str(Path(vault_password_file).resolve())]
    return " ".join(shlex.quote(p) for p in parts)


# ---------------------------------------------------------------------------------------------------------

def _check_extravars(extravars: Mapping[str, Any], secrets: frozenset[str]) -> None:
    """Extra vars reach the command line as JSON that ansible-core trusts: no secret, and no template."""
    for key, val in extravars.items():
        texts = secret_values(val)  # every leaf as text
        if texts & secrets:
            raise UsageError(f"extra var '{key}' holds a secret",
                             hint="put secrets in a vars file (or ansible-vault), never in extra vars")
        if any(mark in text for text in texts for mark in _TEMPLATE_MARKS):
            raise UsageError(f"extra var '{key}' holds a template ({{{{, {{% or {{#}}), which ansible would run",
                             hint="extra vars carry names and numbers from the spec and the state directory: "
                                  "check the swap record there")


def run_playbook(
    playbook: Path | str,
    inventory_dir: Path | str,
    *,
    private_data_dir: Path | str,
    limit: Iterable[str] | str | None = None,
    tags: Iterable[str] | str | None = None,
    check: bool = False,
    diff: bool = False,
    forks: int | None = None,
    extravars: Mapping[str, Any] | None = None,
    event_handler: EventHandler | None = None,
    secret_files: Iterable[Path] = (),
    vault_password_file: Path | None = None,
    secrets: Iterable[str] = (),
    state_dir: Path | str | None = None,
    ident: str = "run",
    roles_path: Path | None = None,
    timeout: int | None = None,
) -> PlaybookResult:
    """Run `playbook` against the inventory through ansible-runner and return the per-host outcome.

    `secret_files` are handed to Ansible as `-e @file` (secrets files belong here; their values are registered
    for redaction unless vault-encrypted); `secrets` adds values to redact. `extravars` must not hold a
    secret: they end up on the command line. Artifacts go to `private_data_dir/artifacts/<ident>`.
    `event_handler` sees each event (already redacted) as it arrives.
    """
    playbook = Path(playbook).resolve()
    require_playbook(playbook)
    roles_path = roles_path or roles_dir()
    inventory = Path(inventory_dir).resolve()
    if not inventory.exists():
        raise UsageError(f"inventory {inventory} does not exist", hint="run `provision render` first")
    pdd = Path(private_data_dir).resolve()
    sdir = ansible_state_dir(Path(state_dir) if state_dir is not None else pdd)  # refused before anything is made
    secret_files = [Path(v) for v in secret_files]
    frozen = _secret_values(secrets, secret_files)
    _check_extravars(extravars or {}, frozen)

    n_forks = forks or DEFAULT_FORKS
    facts_dir, cfg = _prepare_private_data(pdd, sdir, n_forks, roles_path)
    tally = HostTally()
    limit_s = limit if isinstance(limit, str) or limit is None else ",".join(limit)
    tags_s = tags if isinstance(tags, str) or tags is None else ",".join(tags)
    if limit_s == "":
        raise UsageError("empty --limit: no host to run on")
    kwargs: dict[str, Any] = {
        "private_data_dir": str(pdd),
        "project_dir": str(playbook.parent),
        "playbook": str(playbook),
        "inventory": str(inventory),
        "ident": ident,
        "envvars": _run_env(cfg, roles_path),
        "extravars": dict(extravars or {}),
        "suppress_env_files": True,
        "quiet": True,
        "event_handler": _event_sink(frozen, tally, event_handler),
        "fact_cache_type": "jsonfile",
        "fact_cache": str(sdir / "facts"),  # absolute: runner joins it onto the artifact dir
        "forks": n_forks,
        "settings": {"suppress_ansible_output": True},
    }
    cmdline = build_cmdline(check=check, diff=diff, secret_files=secret_files, vault_password_file=vault_password_file)
    kwargs.update({k: v for k, v in {"limit": limit_s, "tags": tags_s, "cmdline": cmdline, "timeout": timeout}.items()
                   if v})
    r, artifact_dir = _run_interruptibly(kwargs, playbook, pdd, frozen, facts_dir)
    error = None
    if not tally.saw_stats and r.status != "successful":
        error = _tail(artifact_dir / "stdout") or f"ansible-playbook ended {r.status} (rc {r.rc})"
    return PlaybookResult(playbook=playbook.name, status=str(r.status), rc=int(r.rc if r.rc is not None else -1),
                          hosts=tally.hosts, artifact_dir=artifact_dir, error=error)


def _secret_values(secrets: Iterable[str], secret_files: list[Path]) -> frozenset[str]:
    """The values to redact: those given (long enough to be secrets) and every value of the secrets files."""
    secret_set: set[str] = {s for s in secrets if len(s) >= MIN_SECRET_LEN}
    for vf in secret_files:
        secret_set |= read_secret_file(vf)
    return frozenset(secret_set)


def _prepare_private_data(pdd: Path, sdir: Path, forks: int, roles_path: Path) -> tuple[Path, Path]:
    """The private data dir, the private facts cache, the SSH control path dir and the run's ansible.cfg."""
    pdd.mkdir(parents=True, exist_ok=True, mode=0o700)
    facts_dir = private_dir(sdir / "facts")  # node facts: the operator's only (the cache writes its files 0644)
    make_files_private(facts_dir)
    cp_dir = control_path_dir(sdir)
    cp_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    cfg = pdd / "ansible.cfg"
    cfg.write_text(render_ansible_cfg(ansible_settings(sdir, forks=forks, roles_path=roles_path)),
                   encoding="utf-8")
    return facts_dir, cfg


def _run_env(cfg: Path, roles_path: Path) -> dict[str, str]:
    """The environment of ansible-playbook: our config, host key checking on, our roles and collections."""
    return {
        "ANSIBLE_CONFIG": str(cfg),
        "ANSIBLE_HOST_KEY_CHECKING": "True",  # ansible-runner defaults it to False when unset
        "ANSIBLE_ROLES_PATH": str(roles_path),
        "ANSIBLE_FORCE_COLOR": "False",
        "PYTHONWARNINGS": pythonwarnings(os.environ),  # no third-party deprecation noise in the run's output
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        **collections_path_env(os.environ),
    }


def _event_sink(frozen: frozenset[str], tally: HostTally,
                event_handler: EventHandler | None) -> Callable[[dict[str, Any]], bool]:
    """runner's event handler: redact the event in place, tally it per host, hand it on."""

    def on_event(event: dict[str, Any]) -> bool:
        if frozen:
            clean = redact_obj(event, frozen)
            event.clear()
            event.update(clean)  # runner writes the dict we were handed: redact it before it hits disk
        tally.feed(event)
        if event_handler is not None:
            event_handler(event)
        return True

    return on_event


def _run_interruptibly(kwargs: dict[str, Any], playbook: Path, pdd: Path, frozen: frozenset[str],
                       facts_dir: Path) -> tuple[Any, Path]:
    """ansible_runner.run under our interrupt handling; the artifacts scrubbed of secrets, the facts private."""
    import ansible_runner

    # Our own cancel callback: without one, ansible-runner installs SIGINT/SIGTERM handlers of its own and
    # leaves them behind, which swallowed every later Ctrl-C (provisioner.interrupt). Checked each second.
    kwargs["cancel_callback"] = interrupt.cancel_requested
    kwargs["settings"]["pexpect_timeout"] = 1
    expected_artifacts = pdd / "artifacts" / kwargs["ident"]

    def scrub_now(_signum: int) -> None:  # a second Ctrl-C exits at once: no secret may stay behind
        scrub_artifacts(expected_artifacts, frozen)

    with interrupt.interruptible(), interrupt.on_abort(scrub_now), interrupt.child_running():
        try:
            r = ansible_runner.run(**kwargs)
        except Exception as exc:  # runner raises its own ConfigurationError/CallbackError and OSErrors
            raise RunnerError(f"ansible-runner could not run {playbook.name}: {exc}") from exc
        artifact_dir = Path(r.config.artifact_dir)
        scrub_artifacts(artifact_dir, frozen)
        make_files_private(facts_dir)
        if interrupt.requested() is not None:  # interrupted while it ran: ansible-playbook was stopped
            interrupt.kill_run_processes(pdd)  # and nothing it started (a worker's module process) lives on
            interrupt.check()
    return r, artifact_dir


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(line for line in text.strip().splitlines()[-lines:])


@dataclass
class FakeRun:
    """A scripted outcome for tests and dry runs: which hosts fail or are unreachable in a playbook."""

    failed: dict[str, str] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)


def fake_result(playbook: str, hosts: Iterable[str], outcome: FakeRun) -> PlaybookResult:
    """A `PlaybookResult` as `run_playbook` would build it for `hosts`, given a scripted outcome."""
    statuses: dict[str, HostStatus] = {}
    for h in hosts:
        hs = HostStatus(h, ok=1)
        if h in outcome.unreachable:
            hs = HostStatus(h, unreachable=1, failed_task="Gathering Facts", message=outcome.unreachable[h])
        elif h in outcome.failed:
            hs = HostStatus(h, ok=1, failed=1, failed_task="scripted", message=outcome.failed[h])
        statuses[h] = hs
    bad = any(s.state != "ok" for s in statuses.values())
    return PlaybookResult(playbook, "failed" if bad else "successful", 2 if bad else 0, statuses, None)
