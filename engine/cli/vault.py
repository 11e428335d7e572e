"""``volsynth vault``: the encrypted vault from the command line.

Sub-commands: ``init``, ``import``, ``ls``, ``edit``, ``export``, ``rm``, ``verify``, ``repair``,
``passwd``, ``audit``. The passphrase is read from a prompt (no echo) or from the first line of
``--passphrase-file``; patient details from ``--patient-file`` or a prompt (``--ask-patient``), so that
they stay out of the process list and the shell history. The vault is ``--vault PATH``, else
``$VOLSYNTH_VAULT``, else the per-user data folder. Every command that unlocks the vault first turns core
dumps off (``engine.vault.core_dumps``). Heavy imports happen inside the commands so that ``volsynth --help`` stays
instant.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from dataclasses import asdict
from pathlib import Path

from engine.errors import InvalidRequest, VaultCorrupted, VaultRolledBack
from engine.formatting import format_bytes  # decimal: the vault CLI has always written kB/MB/GB

PATIENT_KEYS = ("name", "id", "birth_date", "sex")
_PATIENT_HELP = (
    "Patient details are best given with --patient-file FILE (JSON object or key=value lines with keys "
    "name, id, birth_date, sex) or --ask-patient (typed at a prompt): --patient-name and --patient-id "
    "on the command line are visible to other users in the process list and stay in the shell history."
)


def register(subparsers) -> None:
    """Add the ``vault`` command and its sub-commands."""
    parser = subparsers.add_parser(
        "vault",
        help="encrypted vault for patient scans and generated volumes",
        description=(
            "Keep real patient scans (NIfTI, DICOM series) and generated volumes encrypted at rest "
            "(Argon2id + AES-256-GCM), with a tamper-evident audit trail."
        ),
    )
    parser.set_defaults(func=lambda args: _print_help(parser))
    sub = parser.add_subparsers(dest="vault_command", metavar="SUBCOMMAND")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--vault",
        metavar="PATH",
        help="vault folder (default: $VOLSYNTH_VAULT, else ~/.local/share/volsynth/vault)",
    )
    common.add_argument(
        "--passphrase-file",
        metavar="FILE",
        help="read the passphrase from the first line of FILE instead of prompting",
    )
    for add in (
        _add_init,
        _add_import,
        _add_edit,
        _add_ls,
        _add_export,
        _add_rm,
        _add_verify,
        _add_repair,
        _add_passwd,
        _add_rekey,
        _add_audit,
    ):
        add(sub, common)


def _add_study_arguments(p: argparse.ArgumentParser) -> None:
    """The study details `import` and `edit` take."""
    p.add_argument("--study-date", help="study date (YYYY-MM-DD)")
    p.add_argument("--study-description", help="study description")
    p.add_argument("--modality", help="modality (MR, CT...)")


def _add_init(sub, common: argparse.ArgumentParser) -> None:
    """``vault init``: creating a vault."""
    p = sub.add_parser("init", parents=[common], help="create a new vault")
    p.set_defaults(func=_cmd_init)


def _add_import(sub, common: argparse.ArgumentParser) -> None:
    """``vault import``: importing files."""
    p = sub.add_parser(
        "import",
        parents=[common],
        help="import NIfTI files, DICOM series or generated volumes",
        description=(
            "Import NIfTI files or DICOM series. A NIfTI file that VolSynth generated (SYNTHETIC in its "
            "header or a provenance sidecar beside it) is always imported as synthetic, with its "
            "provenance. " + _PATIENT_HELP
        ),
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help=".nii/.nii.gz file, or DICOM folder or file")
    p.add_argument("--dicom", action="store_true", help="treat every PATH as DICOM (default: by name)")
    p.add_argument("--series-uid", help="which series, when a DICOM folder holds several")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument(
        "--synthetic",
        action="store_true",
        help="the NIfTI files are generated volumes (default: decided by their SYNTHETIC marks)",
    )
    kind.add_argument(
        "--scan",
        action="store_true",
        help="the NIfTI files are patient scans: a file with a SYNTHETIC mark is refused",
    )
    p.add_argument("--provenance", metavar="JSON_FILE", help="provenance of a synthetic volume")
    p.add_argument("--label", help="display name")
    _add_patient_arguments(p)
    _add_study_arguments(p)
    p.add_argument(
        "--allow-duplicate", action="store_true", help="store a volume even if the vault already holds it"
    )
    p.set_defaults(func=_cmd_import)


def _add_edit(sub, common: argparse.ArgumentParser) -> None:
    """``vault edit``: editing an item."""
    p = sub.add_parser(
        "edit",
        parents=[common],
        help="change an item's label, patient or study details",
        description="Change an item's details after import (the data is not touched). " + _PATIENT_HELP,
    )
    p.add_argument("item", help="item id (or a unique prefix of at least 4 characters)")
    p.add_argument("--label", help="new display name")
    _add_patient_arguments(p)
    _add_study_arguments(p)
    p.set_defaults(func=_cmd_edit)


def _add_ls(sub, common: argparse.ArgumentParser) -> None:
    """``vault ls``: listing and searching."""
    p = sub.add_parser("ls", parents=[common], help="list or search items")
    p.add_argument("query", nargs="*", help="words to search for in labels, patient and study data")
    p.add_argument("--kind", choices=("scan", "synthetic"))
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_ls)


def _add_export(sub, common: argparse.ArgumentParser) -> None:
    """``vault export``: exporting an item."""
    p = sub.add_parser("export", parents=[common], help="export an item to NIfTI (and DICOM)")
    p.add_argument("item", help="item id (or a unique prefix of at least 4 characters)")
    p.add_argument("dest", help="destination folder")
    p.add_argument(
        "--deidentify",
        action="store_true",
        help="de-identify (DICOM PS3.15 Annex E basic profile; NIfTI text fields and extensions cleared)",
    )
    p.add_argument("--no-dicom", action="store_true", help="do not write the original DICOM files")
    p.add_argument("--no-tissue", action="store_true", help="do not write the item's tissue maps beside it")
    p.add_argument("--overwrite", action="store_true", help="replace existing files")
    p.set_defaults(func=_cmd_export)


def _add_rm(sub, common: argparse.ArgumentParser) -> None:
    """``vault rm``: deleting an item."""
    p = sub.add_parser("rm", parents=[common], help="delete an item")
    p.add_argument("item", help="item id (or a unique prefix)")
    p.set_defaults(func=_cmd_rm)


def _add_verify(sub, common: argparse.ArgumentParser) -> None:
    """``vault verify``: verifying."""
    p = sub.add_parser(
        "verify",
        parents=[common],
        help="authenticate every item and the audit trail, and look for rollback",
        description=(
            "Authenticate every item and the audit trail; report files that were rolled back to an older "
            "version (exit status 13) and list encrypted files the index does not reference."
        ),
    )
    p.add_argument("items", nargs="*", help="only these items (default: all)")
    p.set_defaults(func=_cmd_verify)


def _add_repair(sub, common: argparse.ArgumentParser) -> None:
    """``vault repair``: repairing."""
    p = sub.add_parser(
        "repair",
        parents=[common],
        help="accept a rolled-back vault and re-index the items whose files are still there",
        description=(
            "After a rollback (or an interrupted import): put back into the index every unreferenced item "
            "whose encrypted record and files still authenticate, and accept the vault as it is now. "
            "Nothing is deleted. Run with --dry-run first to see what it would do."
        ),
    )
    p.add_argument("--dry-run", action="store_true", help="only report what would be done")
    p.add_argument(
        "--remove-leftovers",
        action="store_true",
        help="also delete files nothing can bring back (of deleted items, or payloads no record names)",
    )
    p.set_defaults(func=_cmd_repair)


def _add_passwd(sub, common: argparse.ArgumentParser) -> None:
    """``vault passwd``: changing the passphrase."""
    p = sub.add_parser(
        "passwd",
        parents=[common],
        help="change the passphrase (re-wraps the key only: see rekey to lock out an old passphrase)",
        description="Change the passphrase. The master key stays the same: the old passphrase together with "
        "any old copy of vault.json still opens every item. After a leak use `volsynth vault rekey`.",
    )
    p.add_argument("--new-passphrase-file", metavar="FILE", help="read the new passphrase from FILE")
    p.set_defaults(func=_cmd_passwd)


def _add_rekey(sub, common: argparse.ArgumentParser) -> None:
    """``vault rekey``: re-keying."""
    p = sub.add_parser(
        "rekey",
        parents=[common],
        help="re-encrypt everything under a new key and passphrase (after a leaked passphrase)",
        description="Re-encrypt every item, record, index and audit entry under a new random master key "
        "and a new passphrase, so the old passphrase and old copies of vault.json open nothing made since. "
        "Needs free space for one copy of the vault; interrupted, run it again with the same new "
        "passphrase to resume. Backups made before still open with the old passphrase.",
    )
    p.add_argument("--new-passphrase-file", metavar="FILE", help="read the new passphrase from FILE")
    p.set_defaults(func=_cmd_rekey)


def _add_audit(sub, common: argparse.ArgumentParser) -> None:
    """``vault audit``: showing the audit trail."""
    p = sub.add_parser("audit", parents=[common], help="show the audit trail and check its chain")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_audit)


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


# -- helpers ------------------------------------------------------------------------------------------------
def _vault_path(args) -> Path:
    from engine.vault import default_vault_path

    return Path(args.vault).expanduser() if args.vault else default_vault_path()


def _read_passphrase_file(path: str) -> str:
    try:
        text = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read the passphrase file {path}: {exc}") from exc
    line = text.splitlines()[0] if text else ""
    if not line:
        raise InvalidRequest(f"the passphrase file {path} is empty")
    return line


def _prompt(prompt: str) -> str:
    try:
        return getpass.getpass(prompt)
    except EOFError:
        raise InvalidRequest("no passphrase given; type it at the prompt or use --passphrase-file") from None


def _passphrase(file: str | None, prompt: str, *, confirm: bool = False) -> str:
    if file:
        return _read_passphrase_file(file)
    first = _prompt(prompt)
    if confirm and _prompt("Repeat it: ") != first:
        raise InvalidRequest("the passphrases do not match; nothing was changed")
    return first


def _protect() -> None:
    """Core dumps off before any passphrase or patient data is in memory (engine.vault.core_dumps)."""
    from engine.vault.core_dumps import disable_core_dumps

    guard = disable_core_dumps()
    if guard.reason:
        print(f"volsynth: note: {guard.reason}", file=sys.stderr)


def _open(args, *, allow_rollback: bool = False):
    from engine.vault import Vault

    _protect()
    vault = Vault(_vault_path(args))
    vault.unlock(_passphrase(args.passphrase_file, "Vault passphrase: "), allow_rollback=allow_rollback)
    if vault.audit_problem:
        print(f"volsynth: warning: {vault.audit_problem}", file=sys.stderr)
    for warning in vault.warnings:
        print(f"volsynth: warning: {warning}", file=sys.stderr)
    for notice in vault.notices:
        print(f"volsynth: note: {notice}", file=sys.stderr)
    return vault


def _add_patient_arguments(p) -> None:
    p.add_argument(
        "--patient-file",
        metavar="FILE",
        help="read the patient details from FILE: a JSON object or key=value lines (name, id, birth_date, sex)",
    )
    p.add_argument(
        "--ask-patient",
        action="store_true",
        help="type the patient details at a prompt (nothing on the command line)",
    )
    p.add_argument(
        "--patient-name",
        help="patient name; visible in the process list and shell history: prefer --patient-file or --ask-patient",
    )
    p.add_argument("--patient-id", help="patient id; same caveat as --patient-name")
    p.add_argument("--birth-date", help="patient birth date (YYYY-MM-DD)")


def read_patient_file(path: str) -> dict:
    """Patient details from a file: a JSON object, or ``key=value`` lines (``#`` comments, blank lines
    ignored). Keys: name, id, birth_date, sex (``patient_`` prefixes and dashes accepted)."""
    try:
        text = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read the patient file {path}: {exc}") from exc
    raw: dict = {}
    if text.lstrip().startswith("{"):
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise InvalidRequest(f"the patient file {path} is not valid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise InvalidRequest(f"the patient file {path} must hold one JSON object")
    else:
        for n, line in enumerate(text.splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise InvalidRequest(f"line {n} of the patient file {path} is not key=value")
            raw[key.strip()] = value.strip()
    out = {}
    for key, value in raw.items():
        norm = str(key).strip().lower().replace("-", "_").removeprefix("patient_")
        if norm not in PATIENT_KEYS:
            raise InvalidRequest(
                f"the patient file {path} has an unknown key {key!r}; use {', '.join(PATIENT_KEYS)}"
            )
        if value not in (None, ""):
            out[norm] = str(value)
    return out


def _ask_patient() -> dict:
    out = {}
    for key, prompt in (
        ("name", "Patient name: "),
        ("id", "Patient ID: "),
        ("birth_date", "Birth date (YYYY-MM-DD): "),
    ):
        try:
            value = input(prompt).strip()
        except EOFError:
            raise InvalidRequest("no patient details given at the prompt; use --patient-file FILE") from None
        if value:
            out[key] = value
    return out


def _patient(args) -> dict | None:
    """The patient details from --patient-file, --ask-patient and/or the flags (flags win); None if none."""
    patient: dict = {}
    if args.patient_file:
        patient.update(read_patient_file(args.patient_file))
    if args.ask_patient:
        patient.update(_ask_patient())
    flags = {"name": args.patient_name, "id": args.patient_id, "birth_date": args.birth_date}
    patient.update({k: v for k, v in flags.items() if v})
    return patient or None


# -- commands -----------------------------------------------------------------------------------------------
def _cmd_init(args) -> int:
    from engine.vault import Vault

    path = _vault_path(args)
    if Vault.exists(path):
        raise InvalidRequest(f"a vault already exists at {path}")
    _protect()
    passphrase = _passphrase(args.passphrase_file, "New vault passphrase: ", confirm=True)
    vault = Vault.create(path, passphrase)
    kdf = vault.kdf_params
    vault.lock()
    print(
        f"created vault {vault.vault_id[:12]} at {path} "
        f"(Argon2id {kdf.memory_kib // 1024} MiB, t={kdf.iterations}, p={kdf.lanes})"
    )
    return 0


def _cmd_import(args) -> int:
    from engine.nifti.io import is_nifti

    provenance = None
    if args.provenance:
        try:
            provenance = json.loads(Path(args.provenance).read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidRequest(f"cannot read the provenance file {args.provenance}: {exc}") from exc
    patient = _patient(args) or {}
    study = _study_from_args(args)
    paths = [Path(p) for p in args.paths]
    for path in paths:
        if not path.exists():
            raise InvalidRequest(f"no such file or folder: {path}")
    vault = _open(args)
    try:
        for path in paths:
            seen = len(vault.notices)
            if args.dicom or not is_nifti(path):
                info = vault.import_dicom(
                    path, label=args.label, series_uid=args.series_uid, allow_duplicate=args.allow_duplicate
                )
            else:
                if args.synthetic and provenance is None:
                    from engine.vault.synthetic import find_marks

                    if not find_marks(path).synthetic:
                        raise InvalidRequest(
                            f"{path.name}: a synthetic volume needs --provenance FILE (model, seed, settings)"
                        )
                info = vault.import_nifti(
                    path,
                    kind="synthetic" if args.synthetic else "scan" if args.scan else None,
                    label=args.label,
                    patient=patient,
                    study=study,
                    provenance=provenance,
                    allow_duplicate=args.allow_duplicate,
                )
            shape = "x".join(str(n) for n in info.shape)
            extra = f", {info.dicom_files} DICOM files" if info.dicom_files else ""
            if info.tissue_maps:
                extra += f", tissue maps {' '.join(info.tissue_maps)}"
            print(f"imported {path} as {info.kind} {info.id} ({shape}{extra})")
            for notice in vault.notices[seen:]:  # e.g. a tissue map listed in the sidecar but not found
                print(f"volsynth: warning: {notice}", file=sys.stderr)
    finally:
        vault.lock()
    return 0


def _cmd_ls(args) -> int:
    vault = _open(args)
    try:
        items = vault.search(" ".join(args.query), kind=args.kind)
    finally:
        vault.lock()
    if args.json:
        print(json.dumps([asdict(i) for i in items], indent=1))
        return 0
    if not items:
        print("no items" if not args.query else "no matching items")
        return 0
    rows = [("ID", "KIND", "LABEL", "PATIENT", "STUDY DATE", "SHAPE", "SIZE")]
    for i in items:
        patient = i.patient.get("name", "")
        if i.patient.get("id"):
            patient = f"{patient} ({i.patient['id']})".strip()
        rows.append(
            (
                i.id[:12],
                i.kind,
                i.label[:32],
                patient[:28],
                i.study.get("date", ""),
                "x".join(str(n) for n in i.shape),
                format_bytes(i.size_bytes, decimal=True),
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    return 0


def _cmd_export(args) -> int:
    vault = _open(args)
    try:
        result = vault.export(
            args.item,
            args.dest,
            deidentify=args.deidentify,
            include_dicom=not args.no_dicom,
            include_tissue=not args.no_tissue,
            overwrite=args.overwrite,
        )
    finally:
        vault.lock()
    how = "de-identified " if result.deidentified else ""
    print(f"exported {how}{len(result.files)} file(s):")
    for f in result.files:
        print(f"  {f}")
    for w in result.warnings:
        print(f"volsynth: warning: {w}", file=sys.stderr)
    return 0


def _cmd_rm(args) -> int:
    vault = _open(args)
    try:
        info = vault.get(args.item)
        vault.delete(info.id)
    finally:
        vault.lock()
    print(f"deleted {info.kind} {info.id}")
    return 0


def _study_from_args(args) -> dict[str, str]:
    """The study fields given on the command line (import and edit take the same flags)."""
    given = {"date": args.study_date, "description": args.study_description, "modality": args.modality}
    return {k: v for k, v in given.items() if v}


def _cmd_edit(args) -> int:
    study = _study_from_args(args)
    patient = _patient(args)
    vault = _open(args)
    try:
        old = vault.get(args.item)
        info = vault.update_item(
            old.id,
            label=args.label,
            patient={**old.patient, **patient} if patient else None,
            study={**old.study, **study} if study else None,
        )
    finally:
        vault.lock()
    print(f"updated {info.kind} {info.id}")
    return 0


def _cmd_verify(args) -> int:
    vault = _open(args, allow_rollback=True)
    try:
        report = vault.verify(args.items or None)
    finally:
        vault.lock()
    for note in report.notes:
        print(f"note: {note}")
    for name in report.unreferenced:
        print(f"  unreferenced: blobs/{name}")
    if report.ok:
        print(
            f"vault OK: {report.items_checked} item(s), {format_bytes(report.bytes_checked, decimal=True)} authenticated; "
            f"{report.audit_entries} audit entries chained"
        )
        return 0
    print(f"vault PROBLEMS ({len(report.problems)}):")
    for problem in report.problems:
        print(f"  {problem}")
    if report.rolled_back:
        print(
            "Nothing was deleted. Put the newer files back from a backup, or see what "
            "`volsynth vault repair --dry-run` would do."
        )
        return VaultRolledBack.exit_code
    return VaultCorrupted.exit_code


def _cmd_repair(args) -> int:
    vault = _open(args, allow_rollback=True)
    try:
        report = vault.repair(dry_run=args.dry_run, remove_leftovers=args.remove_leftovers)
    finally:
        vault.lock()
    would = "would " if report.dry_run else ""
    for problem in report.accepted:
        print(f"{would}accept: {problem}")
    for item_id, label in report.reindexed:
        print(f"{would}re-index: {item_id} {label}")
    if report.records_written:
        print(f"{would}rewrite the record files of {report.records_written} item(s) (missing or damaged)")
    for line in report.skipped:
        print(f"left alone: {line}")
    for name in report.removed:
        print(f"{would}remove: blobs/{name}")
    if not report.changed:
        print("nothing to repair")
    elif report.dry_run:
        print("dry run: nothing was changed (run without --dry-run to repair)")
    else:
        print(f"repaired: {len(report.reindexed)} item(s) re-indexed; nothing was deleted")
    return 0


def _cmd_passwd(args) -> int:
    from engine.vault import Vault

    _protect()
    vault = Vault(_vault_path(args))
    old = _passphrase(args.passphrase_file, "Current passphrase: ")
    vault.unlock(old)
    try:
        new = _passphrase(args.new_passphrase_file, "New passphrase: ", confirm=True)
        vault.change_passphrase(old, new)
    finally:
        vault.lock()
    print(
        "passphrase changed. The master key is the same: the old passphrase with an old copy of vault.json "
        "(a backup) still opens every item, also those added from now on. If the old passphrase leaked, run "
        "`volsynth vault rekey`."
    )
    return 0


def _cmd_rekey(args) -> int:
    from engine.vault import Vault

    _protect()
    vault = Vault(_vault_path(args))
    old = _passphrase(args.passphrase_file, "Current passphrase: ")
    vault.unlock(old)
    for notice in vault.notices:
        print(f"volsynth: note: {notice}", file=sys.stderr)
    shown = [-1]

    def progress(done: int, total: int) -> None:
        percent = 100 if total == 0 else done * 100 // total
        if percent // 10 != shown[0] // 10 or done == total:
            shown[0] = percent
            print(
                f"re-encrypting: {format_bytes(done, decimal=True)} of {format_bytes(total, decimal=True)} ({percent}%)",
                file=sys.stderr,
                flush=True,
            )

    try:
        new = _passphrase(args.new_passphrase_file, "New passphrase: ", confirm=True)
        report = vault.rekey(old, new, progress=progress)
    finally:
        vault.lock()
    rate = report.bytes_copied / 2**20 / report.seconds if report.seconds > 0 else 0.0
    print(
        f"re-keyed: {report.items} item(s) under a new key and passphrase ({report.copied} re-encrypted now, "
        f"{report.kept} by an earlier interrupted run, {report.audit_entries} audit entries carried over); "
        f"{format_bytes(report.bytes_copied, decimal=True)} in {report.seconds:.1f} s ({rate:.1f} MiB/s). Backups made before "
        "this still open with the old passphrase: delete them."
    )
    return 0


def _cmd_audit(args) -> int:
    vault = _open(args)
    try:
        trail = vault.audit_trail()
    finally:
        vault.lock()
    if args.json:
        print(
            json.dumps(
                {"entries": [asdict(e) for e in trail.entries], "problems": list(trail.problems)}, indent=1
            )
        )
    else:
        for e in trail.entries:
            detail = json.dumps(e.detail, sort_keys=True) if e.detail else ""
            print(
                f"{e.seq:>6}  {e.time}  {e.event:<18} {(e.item_id or '-')[:12]:<12}  {e.user or '-'}  {detail}"
            )
        if trail.ok:
            print(f"audit trail intact: {len(trail.entries)} entries")
        else:
            print(f"audit trail PROBLEMS ({len(trail.problems)}):")
            for problem in trail.problems:
                print(f"  {problem}")
    return 0 if trail.ok else VaultCorrupted.exit_code
