"""The lab's signed vendor apt repository of stand-in NVIDIA packages.

An air-gapped site gives the Ansible roles a local mirror of NVIDIA's repositories; the
lab gives them the same thing: real package names and versions (recipes in
:mod:`provisioner.lab.packages`), built with ``dpkg-deb``, indexed as
``dists/<suite>/main/binary-amd64/Packages(.gz)`` with a ``Release`` carrying hashes, and
signed (``InRelease``, ``Release.gpg``) with a key the lab generates in a private
GNUPGHOME next to the repository (never inside it: the repository is bind-mounted into
the node containers, the secret key must not be).  The public key is exported as a
binary keyring for ``signed-by=``.

The index is written here rather than by apt-ftparchive so the build needs only dpkg-deb
and gpg, and is deterministic: fixed file times, fixed Release date, sorted stanzas.
A rebuild happens only when the inputs change (hash of recipes + versions + signing key).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from provisioner.errors import LabError
from provisioner.lab.packages import PackageRecipe, VendorVersions, recipes_for

__all__ = ["RepoInfo", "VendorVersions", "build_vendor_repo", "collect_recipes"]

SUITES = ("bookworm", "jammy", "noble")
COMPONENT = "main"
ARCH = "amd64"
KEYRING_NAME = "lab-vendor.gpg"
ARMORED_KEY_NAME = "lab-vendor.pub"
"""The same public key ASCII-armored under a ``.pub`` name, the form NVIDIA serves its repository keys in
(CUDA ``3bf863cc.pub``, DOCA ``GPG-KEY-Mellanox.pub``): what the lab hands the roles as the vendor key."""
KEY_UID = "provisioner lab vendor repository <lab-vendor@provisioner.invalid>"
SOURCE_DATE_EPOCH = 1704067200  # 2024-01-01: fixed mtimes and Release date, for reproducible output
RELEASE_DATE = "Mon, 01 Jan 2024 00:00:00 UTC"
STAMP_NAME = ".build-inputs.sha256"
FORMAT_VERSION = "2"  # bump when the repository layout or build changes

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RepoInfo:
    """Where the built repository is and how apt should be pointed at it."""

    path: Path
    keyring_path: Path
    suites: tuple[str, ...]
    url_for_file_repo: str
    packages: tuple[tuple[str, str], ...] = ()

    @property
    def armored_key_path(self) -> Path:
        """The public key, armored, as ``lab-vendor.pub`` (NVIDIA's form)."""
        return self.path / ARMORED_KEY_NAME

    def sources_line(
        self,
        suite: str = "bookworm",
        *,
        mount: str = "/run/lab/vendor-repo",
        keyring: str = f"/etc/apt/keyrings/{KEYRING_NAME}",
    ) -> str:
        """The one-line apt source a node uses for the bind-mounted repository."""
        return f"deb [signed-by={keyring}] file:{mount} {suite} {COMPONENT}"


def collect_recipes(versions: VendorVersions | Sequence[VendorVersions]) -> list[PackageRecipe]:
    """Recipes of every set, de-duplicated by (name, version); conflicting duplicates are an error."""
    sets = [versions] if isinstance(versions, VendorVersions) else list(versions)
    if not sets:
        raise LabError("no vendor versions given", hint="pass at least one VendorVersions")
    chosen: dict[tuple[str, str], PackageRecipe] = {}
    for one in sets:
        for recipe in recipes_for(one):
            seen = chosen.get(recipe.key)
            if seen is not None and seen != recipe:
                raise LabError(
                    f"two version sets build {recipe.name} {recipe.version} with different contents",
                    hint="give them different driver/OFED versions or the same flavor",
                )
            chosen[recipe.key] = recipe
    return sorted(chosen.values(), key=lambda r: r.key)


def _recipe_digest(recipes: Sequence[PackageRecipe]) -> str:
    """Stable hash of everything that ends up in the repository."""
    h = hashlib.sha256(FORMAT_VERSION.encode())
    for r in recipes:
        meta = {
            "name": r.name,
            "version": r.version,
            "description": r.description,
            "section": r.section,
            "depends": r.depends,
            "conflicts": r.conflicts,
            "provides": r.provides,
            "links": r.links,
            "postinst": r.postinst,
            "prerm": r.prerm,
            "extra": sorted(r.extra.items()),
            "release_dir": r.release_dir,
            "files": [(f.path, f.mode, hashlib.sha256(f.content).hexdigest()) for f in r.files],
        }
        h.update(json.dumps(meta, sort_keys=True).encode())
    return h.hexdigest()


def control_text(recipe: PackageRecipe, installed_kib: int) -> str:
    """The DEBIAN/control file of one package."""
    fields = [
        ("Package", recipe.name),
        ("Version", recipe.version),
        ("Architecture", ARCH),
        ("Maintainer", "provisioner lab <lab@provisioner.invalid>"),
        ("Installed-Size", str(installed_kib)),
        ("Depends", ", ".join(recipe.depends)),
        ("Conflicts", ", ".join(recipe.conflicts)),
        ("Provides", ", ".join(recipe.provides)),
        ("Section", recipe.section),
        ("Priority", "optional"),
        *sorted(recipe.extra.items()),
        ("Description", recipe.description),
    ]
    return "".join(f"{k}: {v}\n" for k, v in fields if v)


def _run(argv: list[str], *, env: dict[str, str] | None = None, what: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    except FileNotFoundError as exc:
        raise LabError(f"{what}: {argv[0]} is not installed", hint="apt-get install dpkg gnupg") from exc
    if done.returncode != 0:
        raise LabError(f"{what} failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    return done.stdout


def _touch_tree(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            os.utime(os.path.join(dirpath, name), (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)


def build_deb(recipe: PackageRecipe, pool: Path, scratch: Path, *, flat: bool = False) -> Path:
    """Build one .deb with dpkg-deb --root-owner-group into ``pool/<letter>/<name>/`` (``pool`` itself when
    ``flat``); returns its path."""
    root = scratch / f"{recipe.name}_{recipe.version}"
    (root / "DEBIAN").mkdir(parents=True)
    size = 0
    for entry in recipe.files:
        target = root / entry.path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(entry.content)
        target.chmod(entry.mode)
        size += len(entry.content)
    for link, dest in recipe.links:
        path = root / link.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(dest)
    for script, body in (("postinst", recipe.postinst), ("prerm", recipe.prerm)):
        if body:
            (root / "DEBIAN" / script).write_text(body)
            (root / "DEBIAN" / script).chmod(0o755)
    (root / "DEBIAN" / "control").write_text(control_text(recipe, max(1, (size + 1023) // 1024)))
    for directory in [root, *root.rglob("*")]:
        if directory.is_dir() and not directory.is_symlink():
            directory.chmod(0o755)
    _touch_tree(root)
    out_dir = pool if flat else pool / recipe.name[0] / recipe.name
    out_dir.mkdir(parents=True, exist_ok=True)
    deb = out_dir / f"{recipe.name}_{recipe.version.replace(':', '%3a')}_{ARCH}.deb"
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}
    _run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)], env=env, what="dpkg-deb")
    return deb


def _hashes(data: bytes) -> dict[str, str]:
    return {
        "MD5sum": hashlib.md5(data).hexdigest(),  # noqa: S324 - apt index field, not security
        "SHA1": hashlib.sha1(data).hexdigest(),  # noqa: S324 - apt index field, not security
        "SHA256": hashlib.sha256(data).hexdigest(),
    }


def packages_index(entries: Sequence[tuple[PackageRecipe, Path]], repo: Path) -> str:
    """The ``Packages`` text: control fields plus Filename, Size and hashes."""
    stanzas = []
    for recipe, deb in entries:
        data = deb.read_bytes()
        control = _run(["dpkg-deb", "--field", str(deb)], what="dpkg-deb --field").rstrip("\n")
        head, _, description = control.partition("\nDescription:")
        extra = [f"Filename: {deb.relative_to(repo).as_posix()}", f"Size: {len(data)}"]
        extra += [f"{k}: {v}" for k, v in _hashes(data).items()]
        stanzas.append(head + "\n" + "\n".join(extra) + "\nDescription:" + description + "\n")
        del recipe
    return "\n".join(stanzas)


def release_text(suite: str, files: dict[str, bytes]) -> str:
    """A suite's Release file with MD5Sum/SHA1/SHA256 of its index files."""
    lines = [
        "Origin: provisioner-lab",
        "Label: provisioner-lab-vendor",
        f"Suite: {suite}",
        f"Codename: {suite}",
        f"Date: {RELEASE_DATE}",
        f"Architectures: {ARCH}",
        f"Components: {COMPONENT}",
        "Description: provisioner lab stand-ins for NVIDIA vendor packages",
    ]
    for title, algo in (("MD5Sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256")):
        lines.append(f"{title}:")
        for name in sorted(files):
            digest = hashlib.new(algo, files[name], usedforsecurity=False).hexdigest()
            lines.append(f" {digest} {len(files[name]):>8} {name}")
    return "\n".join(lines) + "\n"


def _gpg_env(gnupg_home: Path) -> dict[str, str]:
    return {**os.environ, "GNUPGHOME": str(gnupg_home)}


def ensure_signing_key(gnupg_home: Path) -> str:
    """Fingerprint of the lab's repository key, generating it (no passphrase) on first use."""
    gnupg_home.mkdir(parents=True, exist_ok=True)
    gnupg_home.chmod(0o700)
    env = _gpg_env(gnupg_home)
    listing = _run(["gpg", "--batch", "--with-colons", "--list-secret-keys"], env=env, what="gpg list keys")
    if "fpr:" not in listing:
        _run(
            ["gpg", "--batch", "--passphrase", "", "--quick-gen-key", KEY_UID, "ed25519", "sign", "never"],
            env=env,
            what="gpg key generation",
        )
        listing = _run(["gpg", "--batch", "--with-colons", "--list-secret-keys"], env=env, what="gpg list keys")
    for line in listing.splitlines():
        if line.startswith("fpr:"):
            return line.split(":")[9]
    raise LabError(f"no signing key in {gnupg_home}")


def _stop_agent(gnupg_home: Path) -> None:
    """gpg starts a gpg-agent for the private home; stop the one we started."""
    subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=_gpg_env(gnupg_home), capture_output=True, check=False)


def sign_release(dist: Path, gnupg_home: Path, fingerprint: str) -> None:
    """Write InRelease (clear-signed) and Release.gpg (detached, armored)."""
    env = _gpg_env(gnupg_home)
    base = ["gpg", "--batch", "--yes", "--local-user", fingerprint, "--digest-algo", "SHA512"]
    release = str(dist / "Release")
    _run([*base, "--clearsign", "--output", str(dist / "InRelease"), release], env=env, what="gpg clearsign")
    _run(
        [*base, "--armor", "--detach-sign", "--output", str(dist / "Release.gpg"), release],
        env=env,
        what="gpg detach-sign",
    )


def export_keyring(gnupg_home: Path, fingerprint: str, dest: Path, *, armor: bool = False) -> None:
    """The public key as a binary keyring (the form apt's ``signed-by=`` takes for a ``.gpg`` name), or
    ASCII-armored with ``armor`` (the form vendors publish as ``.pub``)."""
    env = _gpg_env(gnupg_home)
    cmd = ["gpg", "--batch", *(["--armor"] if armor else []), "--export", fingerprint]
    done = subprocess.run(cmd, env=env, capture_output=True, check=False)
    if done.returncode != 0 or not done.stdout:
        raise LabError(f"gpg --export of {fingerprint} failed: {done.stderr.decode(errors='replace')[-300:]}")
    dest.write_bytes(done.stdout)
    dest.chmod(0o644)


def default_gnupg_home(out_dir: Path) -> Path:
    """Private key home: a sibling of the repository, so it is never bind-mounted into nodes."""
    return out_dir.parent / f".{out_dir.name}.gnupg"


def _info(out_dir: Path, recipes: Sequence[PackageRecipe]) -> RepoInfo:
    return RepoInfo(
        path=out_dir,
        keyring_path=out_dir / KEYRING_NAME,
        suites=SUITES,
        url_for_file_repo=f"file:{out_dir}",
        packages=tuple(r.key for r in recipes),
    )


def build_vendor_repo(
    out_dir: Path | str,
    versions: VendorVersions | Sequence[VendorVersions],
    progress: Progress | None = None,
    *,
    gnupg_home: Path | None = None,
) -> RepoInfo:
    """Build (or reuse) the signed repository holding every set in ``versions``."""
    out = Path(out_dir).resolve()
    say = progress or (lambda _msg: None)
    recipes = collect_recipes(versions)
    real_home = gnupg_home or default_gnupg_home(out)
    real_home.mkdir(parents=True, exist_ok=True)
    with _short_home(real_home) as home:
        return _build(out, recipes, home, say)


GNUPG_HOME_MAX = 60
"""gpg-agent puts its sockets (``S.gpg-agent.browser``...) in GNUPGHOME; a Unix socket path
has 107 bytes at most, so a longer home makes gpg fail with "No agent running"."""


@contextmanager
def _short_home(home: Path) -> Iterator[Path]:
    """``home``, or a short symlink to it under /tmp while gpg runs (the key stays in ``home``)."""
    if len(str(home)) <= GNUPG_HOME_MAX:
        yield home
        return
    with tempfile.TemporaryDirectory(prefix="plab-gpg-") as tmp:
        link = Path(tmp) / "h"
        link.symlink_to(home.resolve(), target_is_directory=True)
        yield link


def _build(out: Path, recipes: Sequence[PackageRecipe], home: Path, say: Progress) -> RepoInfo:
    """The build proper, with ``home`` a GNUPGHOME short enough for gpg-agent's sockets."""
    try:
        fingerprint = ensure_signing_key(home)
        digest = hashlib.sha256(f"{_recipe_digest(recipes)}:{fingerprint}".encode()).hexdigest()
        stamp = out / STAMP_NAME
        if stamp.is_file() and stamp.read_text().strip() == digest:
            say(f"vendor repo up to date ({len(recipes)} packages)")
            return _info(out, recipes)
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".vendor-repo-", dir=out.parent) as tmp:
            stage = Path(tmp) / "repo"
            pool = stage / "pool" / COMPONENT
            entries = []
            for recipe in recipes:
                say(f"building {recipe.name} {recipe.version}")
                if recipe.release_dir:  # a vendor's release file outside the apt index (enroot's .debs)
                    build_deb(recipe, stage / recipe.release_dir, Path(tmp) / "roots", flat=True)
                    continue
                entries.append((recipe, build_deb(recipe, pool, Path(tmp) / "roots")))
            index = packages_index(entries, stage).encode()
            index_gz = gzip.compress(index, compresslevel=9, mtime=0)
            for suite in SUITES:
                dist = stage / "dists" / suite
                binary = dist / COMPONENT / f"binary-{ARCH}"
                binary.mkdir(parents=True)
                (binary / "Packages").write_bytes(index)
                (binary / "Packages.gz").write_bytes(index_gz)
                rel = f"{COMPONENT}/binary-{ARCH}"
                (dist / "Release").write_text(
                    release_text(suite, {f"{rel}/Packages": index, f"{rel}/Packages.gz": index_gz})
                )
                sign_release(dist, home, fingerprint)
            export_keyring(home, fingerprint, stage / KEYRING_NAME)
            export_keyring(home, fingerprint, stage / ARMORED_KEY_NAME, armor=True)
            (stage / STAMP_NAME).write_text(digest + "\n")
            _replace_contents(out, stage)
        say(f"vendor repo built: {len(recipes)} packages, suites {', '.join(SUITES)}")
        return _info(out, recipes)
    finally:
        _stop_agent(home)


def _replace_contents(out: Path, stage: Path) -> None:
    """Swap the repository's contents but keep the directory itself (it may be bind-mounted)."""
    for child in out.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    for child in stage.iterdir():
        os.replace(child, out / child.name)
