"""A taught bank (coreset patch features + calibrated threshold) and its versioned on-disk store.

    <root>/<part>/v0001/bank.json        metadata (everything but the features)
    <root>/<part>/v0001/features.npy     [K, C] float32 coreset
    <root>/<part>/v0001/whitening.npy    [C + 1, C] float32 mean and whitening matrix (banks taught with one)
    <root>/<part>/CURRENT                "v0003": the version the gate serves
    <root>/<part>/STAGED                 "v0004": a version written but held back until promoted (optional)

A version folder is written whole under a temporary name, fsynced and renamed into place; CURRENT is swapped by
temp file + fsync + rename + directory fsync. A crash at any point leaves the previous version current and whole.
STAGED is swapped the same way. A part has at most one staged version: a newer staged teach supersedes it (it stays
on disk as an old version). Promote swaps CURRENT first, then drops STAGED: a crash between the two leaves a STAGED
that names the current version, which reads as nothing staged.

A version moves between stores (vision boxes with their own bank folders) as a BankArchive: a deterministic tar of
its folder's files and its teach frames (<part>/frames/<hash16>/, services/vision/teach_frames.py), addressed by its
sha256. An import is written whole under a temporary name and renamed into place like a publish; it keeps the
version number, so every store names one bank the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from edgeinspect.durable import fsync_dir, write_folder, write_synced
from edgeinspect.errors import FailedPrecondition, InvalidInput, NotFound

PART_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
VERSION_DIR = re.compile(r"v(\d{4,})")
FORMAT = 1  # bank.json layout; bump on incompatible change
CURRENT, STAGED = "CURRENT", "STAGED"  # the part's pointer files: the live version, the held-back one
ARRAYS = ("features", "whitening")  # Bank fields stored as .npy files beside bank.json, not in it
FRAMES = "frames"  # <part>/frames/<content hash 16>/: a version's kept teach frames (services/vision/teach_frames.py)
VERSION_FILES = ("bank.json", "features.npy", "whitening.npy")  # what a version folder may hold
FRAME_MEMBER = re.compile(rf"{FRAMES}/([0-9a-f]{{16}})/([A-Za-z0-9][A-Za-z0-9._-]{{0,63}})")


@dataclass
class Bank:
    """What the gate scores against for one part: good-patch coreset, threshold, and how it was made."""

    part: str
    version: int  # 0 until BankStore.publish assigns one
    extractor: dict  # the extractor's describe(): name, options, fingerprint, grid, channels
    fingerprint: str  # the extractor's fingerprint: a scorer with another one refuses this bank
    features: np.ndarray  # [K, C] float32 coreset of good patch features
    grid: tuple[int, int]  # the extractor's patch grid (h, w)
    threshold: float  # image score above which a frame is not OK
    band: tuple[float, float]  # (the OK cut, the DEFECT cut): below low OK, above high DEFECT, between UNCERTAIN
    teach_hashes: list[str]  # sha256 of each kept teach frame's bytes
    coreset_ratio: float
    created_at: str  # ISO 8601 UTC
    stats: dict = field(default_factory=dict)  # LOO score summary, timings, frame counts, outliers
    border: int = 0  # patch rings at the grid's edge outside the image score (teach.py BORDER)
    blur: float = 0.0  # Gaussian sigma (patches) over the patch scores before the image score's max; 0: none
    # [C + 1, C] float32 (whiten.py): the mean and matrix applied to a frame's patches before kNN; the features are
    # stored whitened. None in banks taught before it existed (and with --no-whiten): raw features.
    whitening: np.ndarray | None = None

    @cached_property
    def content_hash(self) -> str:
        """sha256 over what decides a verdict (features, threshold, band, fingerprint, teach set), not the version."""
        h = hashlib.sha256()
        meta = [self.part, self.fingerprint, list(self.grid), self.threshold, list(self.band), self.teach_hashes]
        if self.border:  # what the image score covers decides verdicts too
            meta.append(self.border)
        if self.blur:  # and how it is smoothed (absent from banks taught before it existed: their hash holds)
            meta.append(["blur", self.blur])
        h.update(json.dumps(meta, sort_keys=True).encode())
        h.update(np.ascontiguousarray(self.features, dtype=np.float32).tobytes())
        if self.whitening is not None:  # absent from older banks: their hash holds
            h.update(b"whitening")
            h.update(np.ascontiguousarray(self.whitening, dtype=np.float32).tobytes())
        return h.hexdigest()

    @property
    def bank_id(self) -> str:
        """part@vN:hash8, what reports and replicas compare."""
        return f"{self.part}@v{self.version}:{self.content_hash[:8]}"

    def metadata(self) -> dict:
        """Everything but the features, JSON-able (bank.json, `anomaly banks show`)."""
        meta = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ARRAYS}
        meta.update(format=FORMAT, bank_id=self.bank_id, grid=list(self.grid), band=list(self.band))
        meta["patches"], meta["channels"] = int(self.features.shape[0]), int(self.features.shape[1])
        return meta


@dataclass(frozen=True)
class BankArchive:
    """One published version as it travels between stores: a deterministic tar of its files, and its sha256."""

    part: str
    version: int
    bank_id: str
    staged: bool  # the version is its store's staged one (held back), not its current one
    data: bytes  # tar: bank.json, features.npy[, whitening.npy][, frames/<hash16>/...]
    sha256: str

    @staticmethod
    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()


def default_banks_dir() -> Path:
    """EDGEINSPECT_BANKS, else the embedded stack's work dir: var/embedded/banks."""
    env = os.environ.get("EDGEINSPECT_BANKS")
    return Path(env).expanduser() if env else Path("var/embedded/banks")


def check_part(part: str) -> str:
    """A part name is a path component we create: letters, digits, . _ -, no traversal."""
    if not isinstance(part, str) or not PART_NAME.fullmatch(part) or part.strip(".") == "":
        raise InvalidInput(f"part name {part!r} is not allowed: use letters, digits, '.', '_', '-' (at most 64)")
    return part


class BankStore:
    """Banks per part under one root folder, versioned; publish and rollback never leave a half-written bank."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def list_parts(self) -> list[str]:
        """Parts with at least one published version."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if PART_NAME.fullmatch(p.name) and self._numbers(p.name))

    def versions(self, part: str) -> list[Bank]:
        """Every readable published version of a part, oldest first (features memory-mapped, not read); a damaged
        one is left out here (read_versions says why)."""
        return [bank for bank in self.read_versions(part).values() if isinstance(bank, Bank)]

    def read_versions(self, part: str) -> dict[int, Bank | str]:
        """Every published version of a part by number, oldest first: its Bank (features memory-mapped), or why it
        cannot be read."""
        out: dict[int, Bank | str] = {}
        for number in self._numbers(check_part(part)):
            try:
                out[number] = self._read(part, number, mmap=True)
            except (NotFound, FailedPrecondition) as exc:
                out[number] = _reason(exc)
        return out

    def remove(self, part: str, version: int) -> None:
        """Deletes one version (a damaged one too); never the current one: roll back to another first. A staged
        version removed is no longer staged."""
        part_dir = self.root / check_part(part)
        folder = part_dir / _dirname(int(version))
        if not folder.is_dir():
            raise NotFound(f"part {part!r} has no bank version {version} in {self.root}")
        with _locked(part_dir):
            if self.current_version(part) == int(version):
                raise FailedPrecondition(f"part {part!r}: v{version} is the current version: `banks rollback` to "
                                         "another version first")  # fmt: skip
            if self.staged_version(part) == int(version):
                (part_dir / STAGED).unlink()
            doomed = Path(tempfile.mkdtemp(prefix=".tmp-removed-", dir=part_dir))
            os.rename(folder, doomed / folder.name)  # the version disappears whole, then its files go
            fsync_dir(part_dir)
            shutil.rmtree(doomed, ignore_errors=True)

    def current(self, part: str) -> Bank | None:
        """The version CURRENT names, or None where the part has none."""
        number = self.current_version(check_part(part))
        return None if number is None else self._read(part, number)

    def load(self, part: str, version: int | None = None) -> Bank:
        """One version (default: the current one); NotFound where there is none."""
        check_part(part)
        number = self.current_version(part) if version is None else int(version)
        if number is None:
            raise NotFound(f"part {part!r} has no anomaly bank in {self.root}: teach one first")
        return self._read(part, number)

    def staged(self, part: str) -> Bank | None:
        """The version STAGED names (held back, not scored against), or None where the part has none."""
        number = self.staged_version(check_part(part))
        return None if number is None else self._read(part, number)

    def publish(self, bank: Bank, stage: bool = False) -> Bank:
        """Writes the bank as the part's next version and makes it current (stage: the part's staged version,
        CURRENT unchanged); returns it with its version."""
        part_dir = self.root / check_part(bank.part)
        part_dir.mkdir(parents=True, exist_ok=True)
        with _locked(part_dir):
            number = max(self._numbers(bank.part), default=0) + 1
            published = dataclasses.replace(bank, version=number)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=part_dir))
            final = part_dir / _dirname(number)
            try:
                self._write_version(tmp, published)
                os.rename(tmp, final)  # the version appears whole or not at all
                fsync_dir(part_dir)
                self._set_pointer(part_dir, STAGED if stage else CURRENT, number)
            except BaseException:
                # Nothing became current: remove what this attempt wrote, the previous version stays current.
                shutil.rmtree(tmp, ignore_errors=True)
                if number not in (self.current_version(bank.part), self.staged_version(bank.part)):
                    shutil.rmtree(final, ignore_errors=True)
                raise
        return published

    def rollback(self, part: str, version: int) -> Bank:
        """Makes an earlier (or later) published version current again; not the staged one (promote it)."""
        bank = self.load(part, version)  # NotFound / unreadable before anything changes
        part_dir = self.root / part
        with _locked(part_dir):
            if self.staged_version(part) == bank.version:
                raise FailedPrecondition(
                    f"part {part!r}: v{bank.version} is staged, never live: promote it (its go-live figures are "
                    "checked first) instead of rolling back to it"
                )
            self._set_pointer(part_dir, CURRENT, bank.version)
        return bank

    def promote(self, part: str, version: int, check: Callable[[Bank, Bank | None], None] | None = None) -> Bank:
        """Makes the part's staged version current; `check(staged, current)` runs under the part's lock first and
        raises to refuse (golive.promote passes the go-live gate)."""
        bank = self.load(part, version)  # NotFound / unreadable before anything changes
        part_dir = self.root / part
        with _locked(part_dir):
            staged, current = self.staged_version(part), self.current_version(part)
            if bank.version == current:
                raise FailedPrecondition(f"part {part!r}: v{bank.version} is already the current version")
            if bank.version != staged:
                now = f"v{staged} is" if staged is not None else "no version is"
                raise FailedPrecondition(f"part {part!r}: v{bank.version} is not staged ({now} staged); "
                                         "`banks rollback` makes an earlier live version current again")  # fmt: skip
            if check is not None:
                check(bank, None if current is None else self._read(part, current))
            self._set_pointer(part_dir, CURRENT, bank.version)
            (part_dir / STAGED).unlink(missing_ok=True)
            fsync_dir(part_dir)
        return bank

    def export_archive(self, part: str, version: int) -> BankArchive:
        """A published version (and its teach frames where kept) as a BankArchive; NotFound where there is none."""
        bank = self.load(part, version)  # NotFound / corrupted before anything is read for the archive
        folder = self.root / part / _dirname(bank.version)
        files = [(name, folder / name) for name in VERSION_FILES if (folder / name).is_file()]
        frames = self.root / part / FRAMES / bank.content_hash[:16]
        if frames.is_dir():
            named = ((f"{FRAMES}/{frames.name}/{f.name}", f) for f in frames.iterdir())
            files += [(name, f) for name, f in named if FRAME_MEMBER.fullmatch(name) and f.is_file()]
        data = _tar(files)
        staged = self.staged_version(part) == bank.version
        return BankArchive(part, bank.version, bank.bank_id, staged, data, BankArchive.digest(data))

    def import_archive(self, archive: BankArchive) -> tuple[Bank, bool]:
        """Installs another store's version under its own number (its teach frames too); returns it and whether it
        is this store's staged version now. A version already held with the same content writes nothing; its
        pointers still follow the archive: a live version newer than CURRENT becomes current, a staged one newer
        than CURRENT and STAGED becomes staged. InvalidInput where the archive is not a whole bank of its part and
        version (nothing written), FailedPrecondition where this store holds that version number with other content."""
        part, number = check_part(archive.part), int(archive.version)
        if number < 1:
            raise InvalidInput(f"part {part!r}: bank version must be 1 or more, got {number}")
        if BankArchive.digest(archive.data) != archive.sha256:
            raise InvalidInput(f"the archive of part {part!r} v{number} does not match its sha256 {archive.sha256[:12]}"
                               " (corrupted in transit?): nothing was imported")  # fmt: skip
        members = _untar(archive.data, part, number)
        part_dir = self.root / part
        part_dir.mkdir(parents=True, exist_ok=True)
        with _locked(part_dir):
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=part_dir))
            try:
                bank = self._install_version(tmp, members, part, number)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            self._install_frames(part_dir, bank, members)
            staged = self._follow_pointers(part_dir, number, archive.staged)
        return self._read(part, number), staged

    def _install_version(self, tmp: Path, members: dict[str, bytes], part: str, number: int) -> Bank:
        """The archive's version files written and checked in `tmp`, then renamed into place (unless held)."""
        for name in VERSION_FILES:
            if name in members:
                write_synced(tmp / name, members[name])
        fsync_dir(tmp)
        what = f"the archive of part {part!r} v{number}"
        try:
            bank = self._read_folder(tmp, part, number)
        except NotFound:
            raise InvalidInput(f"{what} is not a whole bank: it lacks bank.json or features.npy") from None
        except FailedPrecondition as exc:
            raise InvalidInput(f"{what} is not a whole bank: {_reason(exc)}") from None
        if bank.part != part:
            raise InvalidInput(f"{what} holds a bank of part {bank.part!r}")
        hashes = {m.group(1) for m in map(FRAME_MEMBER.fullmatch, members) if m}
        if hashes - {bank.content_hash[:16]}:
            raise InvalidInput(f"{what} holds teach frames of another bank than {bank.bank_id}")
        final = self.root / part / _dirname(number)
        if final.exists():
            held = self._read(part, number)
            if held.content_hash != bank.content_hash:
                raise FailedPrecondition(
                    f"part {part!r}: this store holds another v{number} ({held.bank_id}) than the one imported "
                    f"({bank.bank_id}); a version number names one bank: remove one of them by hand"
                )
            return held
        os.rename(tmp, final)  # the version appears whole or not at all
        fsync_dir(final.parent)
        return bank

    @staticmethod
    def _install_frames(part_dir: Path, bank: Bank, members: dict[str, bytes]) -> None:
        """The archive's teach frames, under the bank's content hash, unless already there (same content)."""
        frames = {n.rsplit("/", 1)[1]: data for n, data in members.items() if n.startswith(f"{FRAMES}/")}
        final = part_dir / FRAMES / bank.content_hash[:16]
        if frames and not final.is_dir():
            write_folder(final, frames)

    def _follow_pointers(self, part_dir: Path, number: int, staged: bool) -> bool:
        """CURRENT or STAGED moved to an imported version where it is newer; returns whether it is staged here."""
        part = part_dir.name
        current = self.current_version(part)
        newer = current is None or number > current
        if staged:
            held = self.staged_version(part)
            if newer and (held is None or number >= held):
                if held != number:
                    self._set_pointer(part_dir, STAGED, number)
                return True
            return False
        if newer:
            self._set_pointer(part_dir, CURRENT, number)
        if self._pointer(part, STAGED) == number:  # promoted where it came from: nothing staged here either
            (part_dir / STAGED).unlink(missing_ok=True)
            fsync_dir(part_dir)
        return False

    def _numbers(self, part: str) -> list[int]:
        part_dir = self.root / part
        if not part_dir.is_dir():
            return []
        found = (VERSION_DIR.fullmatch(p.name) for p in part_dir.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def current_version(self, part: str) -> int | None:
        """The version number CURRENT names (a few bytes: cheap to poll), or None where the part has none."""
        return self._pointer(part, CURRENT)

    def staged_version(self, part: str) -> int | None:
        """The version number STAGED names, or None where nothing is staged (or it is already current)."""
        number = self._pointer(part, STAGED)
        return None if number is None or number == self.current_version(part) else number

    def _pointer(self, part: str, name: str) -> int | None:
        try:
            text = (self.root / part / name).read_text().strip()
        except FileNotFoundError:
            return None
        match = VERSION_DIR.fullmatch(text)
        if not match:
            raise FailedPrecondition(f"{self.root / part / name} holds {text!r}, not a version like v0003")
        return int(match.group(1))

    def _read(self, part: str, number: int, mmap: bool = False) -> Bank:
        return self._read_folder(self.root / part / _dirname(number), part, number, mmap)

    def _read_folder(self, folder: Path, part: str, number: int, mmap: bool = False) -> Bank:
        try:
            meta = json.loads((folder / "bank.json").read_text())
            features = np.load(folder / "features.npy", mmap_mode="r" if mmap else None, allow_pickle=False)
            white = folder / "whitening.npy"
            whitening = np.load(white, allow_pickle=False) if white.exists() else None
        except FileNotFoundError as exc:
            raise NotFound(f"part {part!r} has no bank version {number} in {self.root}") from exc
        except (OSError, ValueError) as exc:
            raise FailedPrecondition(f"bank {folder} is unreadable: {exc}") from exc
        if not isinstance(meta, dict) or any(key not in meta for key in ("grid", "band", "bank_id")):
            raise FailedPrecondition(f"bank {folder} is unreadable: its bank.json lacks what a bank records")
        if meta.get("format") != FORMAT:
            raise FailedPrecondition(f"bank {folder} has format {meta.get('format')}, this build reads {FORMAT}")
        names = {f.name for f in dataclasses.fields(Bank)} - set(ARRAYS)
        kwargs = {k: v for k, v in meta.items() if k in names}
        kwargs.update(grid=tuple(meta["grid"]), band=tuple(meta["band"]), version=number)
        bank = Bank(features=features, whitening=whitening, **kwargs)
        if not mmap and bank.bank_id != meta["bank_id"]:
            raise FailedPrecondition(f"bank {folder} does not match its recorded id {meta['bank_id']}: corrupted")
        return bank

    @staticmethod
    def _write_version(folder: Path, bank: Bank) -> None:
        arrays = {"features": bank.features, "whitening": bank.whitening}
        for name, array in arrays.items():
            if array is None:
                continue
            with (folder / f"{name}.npy").open("wb") as f:
                np.save(f, np.ascontiguousarray(array, dtype=np.float32), allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
        write_synced(folder / "bank.json", (json.dumps(bank.metadata(), indent=2, sort_keys=True) + "\n").encode())
        fsync_dir(folder)

    @staticmethod
    def _set_pointer(part_dir: Path, name: str, number: int) -> None:
        """CURRENT or STAGED := vNNNN, by temp file + fsync + rename + directory fsync."""
        tmp = part_dir / f"{name}.tmp"
        write_synced(tmp, (_dirname(number) + "\n").encode())
        os.replace(tmp, part_dir / name)
        fsync_dir(part_dir)


def _dirname(number: int) -> str:
    return f"v{number:04d}"


def _reason(exc: Exception) -> str:
    """An error's text without the temporary folder it names (a peer reads it)."""
    return re.sub(r"\S*\.tmp-\S*", "the archive", str(exc))


def _tar(files: list[tuple[str, Path]]) -> bytes:
    """The files as a tar whose bytes depend on their names and contents only (sorted, no times, owners or modes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, path in sorted(files):
            data = path.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _untar(data: bytes, part: str, number: int) -> dict[str, bytes]:
    """An archive's members by name: regular files named as export_archive names them, nothing else."""
    members: dict[str, bytes] = {}
    what = f"the archive of part {part!r} v{number}"
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for info in tar:
                allowed = info.name in VERSION_FILES or FRAME_MEMBER.fullmatch(info.name)
                if not info.isreg() or not allowed or info.name in members:
                    raise InvalidInput(f"{what} holds {info.name!r}, not a bank file")
                members[info.name] = tar.extractfile(info).read()
    except (tarfile.TarError, EOFError):
        raise InvalidInput(f"{what} is not a tar archive") from None
    return members


@contextlib.contextmanager
def _locked(part_dir: Path) -> Iterator[None]:
    """An exclusive flock on <part>/.lock: two admins publishing at once get consecutive versions."""
    fd = os.open(part_dir / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock
