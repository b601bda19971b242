"""Moving a bank version between bank folders (BankStore.export_archive / import_archive) and recording it in the
report database (services/store/banks.py, schema version 7) on SQLite and PostgreSQL (issue 69, item 2)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import tarfile

import numpy as np
import pytest

from edgeinspect.errors import FailedPrecondition, InvalidInput, NotFound
from edgeinspect.models.anomaly.bank import Bank, BankArchive, BankStore
from edgeinspect.services.store.banks import BankVersions, PublishedBank
from edgeinspect.services.store.database import PostgresDatabase, SQLiteDatabase

PART = "board"


def bank(seed: int = 0, whitening: bool = True) -> Bank:
    rng = np.random.default_rng(seed)
    return Bank(
        part=PART, version=0, extractor={"name": "raw-pixel", "options": {}}, fingerprint="raw-pixel:test",
        features=rng.normal(size=(32, 8)).astype(np.float32), grid=(4, 4), threshold=1.5, band=(1.4, 1.6),
        teach_hashes=[f"{seed:064x}"], coreset_ratio=0.5, created_at="2026-12-07T00:00:00+00:00",
        whitening=rng.normal(size=(9, 8)).astype(np.float32) if whitening else None,
    )  # fmt: skip


def with_frames(store: BankStore, published: Bank) -> None:
    """Teach frames where services/vision/teach_frames.py keeps them."""
    folder = store.root / PART / "frames" / published.content_hash[:16]
    folder.mkdir(parents=True)
    (folder / "0000.png").write_bytes(b"\x89PNG frame")
    (folder / "frames.json").write_text('{"names": ["frame-0000"], "frame_size": [8, 8]}')


def test_an_exported_version_imports_whole_in_another_folder_under_its_number(tmp_path):
    source, target = BankStore(tmp_path / "a"), BankStore(tmp_path / "b")
    source.publish(bank(1))
    v2 = source.publish(bank(2))
    with_frames(source, v2)
    archive = source.export_archive(PART, 2)
    assert archive.sha256 == hashlib.sha256(archive.data).hexdigest() and archive.bank_id == v2.bank_id
    assert source.export_archive(PART, 2).data == archive.data, "the archive is deterministic"
    imported, staged = target.import_archive(archive)
    assert (imported.bank_id, staged) == (v2.bank_id, False)
    assert target.current_version(PART) == 2 and target.load(PART).bank_id == v2.bank_id
    np.testing.assert_array_equal(target.load(PART).whitening, v2.whitening)
    frames = target.root / PART / "frames" / v2.content_hash[:16]
    assert (frames / "0000.png").read_bytes() == b"\x89PNG frame"
    assert not [p for p in (target.root / PART).iterdir() if p.name.startswith(".tmp-")]
    assert target.publish(bank(3)).version == 3, "a teach after an import numbers after it"


def test_an_older_version_imports_without_moving_current_and_a_staged_one_stays_staged(tmp_path):
    source, target = BankStore(tmp_path / "a"), BankStore(tmp_path / "b")
    source.publish(bank(1))
    source.publish(bank(2))
    source.publish(bank(3), stage=True)
    target.import_archive(source.export_archive(PART, 2))
    target.import_archive(source.export_archive(PART, 1))
    assert target.current_version(PART) == 2
    staged = source.export_archive(PART, 3)
    assert staged.staged
    _, is_staged = target.import_archive(staged)
    assert is_staged and target.staged_version(PART) == 3 and target.current_version(PART) == 2
    source.promote(PART, 3)
    promoted = source.export_archive(PART, 3)
    assert promoted.sha256 == staged.sha256 and not promoted.staged
    _, is_staged = target.import_archive(promoted)  # the same files: only the pointers follow
    assert not is_staged and target.current_version(PART) == 3 and target.staged_version(PART) is None


def test_the_same_version_again_is_a_no_op_and_other_content_under_its_number_is_refused(tmp_path):
    source, target = BankStore(tmp_path / "a"), BankStore(tmp_path / "b")
    archive = source.export_archive(PART, source.publish(bank(1)).version)
    target.import_archive(archive)
    before = (target.root / PART / "v0001" / "features.npy").stat().st_mtime_ns
    target.import_archive(archive)
    assert (target.root / PART / "v0001" / "features.npy").stat().st_mtime_ns == before
    other = BankStore(tmp_path / "c")
    conflicting = other.export_archive(PART, other.publish(bank(9)).version)
    with pytest.raises(FailedPrecondition, match="holds another v1") as err:
        target.import_archive(conflicting)
    assert str(tmp_path) not in str(err.value)
    assert target.load(PART, 1).bank_id == archive.bank_id


def test_an_archive_not_matching_its_sha256_or_not_a_bank_writes_nothing(tmp_path):
    source, target = BankStore(tmp_path / "a"), BankStore(tmp_path / "b")
    archive = source.export_archive(PART, source.publish(bank(1)).version)
    with pytest.raises(InvalidInput, match="does not match its sha256"):
        target.import_archive(dataclasses.replace(archive, sha256="0" * 64))
    assert not (target.root / PART).exists()

    def tar(members: dict[str, bytes]) -> BankArchive:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        data = buf.getvalue()
        return dataclasses.replace(archive, data=data, sha256=BankArchive.digest(data))

    with pytest.raises(InvalidInput, match="not a bank file"):
        target.import_archive(tar({"../../escape.json": b"{}"}))
    with pytest.raises(InvalidInput, match="not a whole bank"):
        target.import_archive(tar({"bank.json": b"{}"}))
    with pytest.raises(InvalidInput, match="not a tar archive"):
        target.import_archive(dataclasses.replace(archive, data=b"junk", sha256=BankArchive.digest(b"junk")))
    assert target.list_parts() == [] and not (tmp_path / "escape.json").exists()
    with pytest.raises(NotFound):
        source.export_archive(PART, 7)


@pytest.fixture
def versions(report_db):
    report_db.store().close()  # migrated to schema 7
    db = SQLiteDatabase(report_db.tmp / "reports.sqlite") if report_db.backend == "sqlite" else None
    found = BankVersions(db or PostgresDatabase(report_db.dsn))
    yield found
    found.close()


def row(version: int, data: bytes, staged: bool = False) -> PublishedBank:
    sha = hashlib.sha256(data).hexdigest()
    return PublishedBank(PART, version, f"{PART}@v{version}:{sha[:8]}", sha, staged, "127.0.0.1:1", data)


def test_published_versions_list_the_newest_per_part_and_read_back_checked(versions):
    assert versions.newest() == []
    assert versions.publish(row(1, b"one")) and versions.publish(row(2, b"two"))
    assert versions.publish(row(3, b"three", staged=True))
    assert [(b.version, b.staged) for b in versions.newest()] == [(2, False), (3, True)]
    assert not versions.publish(row(2, b"two")), "the same archive again changes nothing"
    assert versions.publish(row(3, b"three", staged=False)), "a promote clears the staged flag"
    assert [(b.version, b.staged) for b in versions.newest()] == [(3, False)]
    got = versions.get(PART, 2)
    assert got.archive == b"two" and got.sha256 == hashlib.sha256(b"two").hexdigest() and got.origin == "127.0.0.1:1"
    with pytest.raises(FailedPrecondition, match="holds another v2"):
        versions.publish(row(2, b"not two"))
    with pytest.raises(FailedPrecondition, match="does not match its sha256"):
        versions.publish(dataclasses.replace(row(4, b"four"), archive=b"changed"))
    with pytest.raises(NotFound):
        versions.get(PART, 9)
