"""``volsynth models``: every model the registry finds, with its conditioning inputs and ranges, every
folder in the search path that could not be opened (listed as broken with its reason), and the catalogue's
real models that can be fetched.

``volsynth models get NAME`` fetches a catalogue model from its hub (licence first, then free disk, then
the files, resumable, each SHA-256 checked, placed whole); ``volsynth models add FOLDER`` installs a copy
brought by hand, checked the same way.
"""

from __future__ import annotations

import json
import sys


def _say(*parts, **options) -> None:
    """``print`` for text that comes from hubs, catalogues and model folders: no escape or control sequences
    reach the terminal (a licence once carried a clipboard-write sequence)."""
    from engine.formatting import terminal_safe

    print(*(terminal_safe(str(part)) for part in parts), **options)


def register(sub) -> None:
    parser = sub.add_parser("models", help="list, get or add models")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=run)
    actions = parser.add_subparsers(dest="models_action", metavar="ACTION")
    get = actions.add_parser(
        "get", help="fetch a real model from its hub (see the catalogue in `volsynth models`)"
    )
    get.add_argument("name", help="the catalogue name, e.g. nv-generate-mr-brain or brain-ldm")
    get.add_argument(
        "--accept-licence",
        action="store_true",
        help="accept the model's licence (for scripts; read it first)",
    )
    get.set_defaults(func=run_get)
    add = actions.add_parser(
        "add", help="install a model folder brought by hand (checked, copied into place)"
    )
    add.add_argument("folder", help="the folder holding the model's files")
    add.add_argument("--model", help="the catalogue name the files belong to (checks and adds its configs)")
    add.add_argument("--accept-licence", action="store_true", help="accept the model's licence")
    add.set_defaults(func=run_add)
    remove = actions.add_parser(
        "remove", help="delete an installed catalogue model from your models folder and forget its hashes"
    )
    remove.add_argument("name", help="the catalogue name, e.g. nv-generate-mr-brain")
    remove.set_defaults(func=run_remove)
    verify = actions.add_parser(
        "verify", help="check an installed catalogue model against its networks and its publisher's hashes"
    )
    verify.add_argument("name", help="the catalogue name, e.g. nv-generate-mr-brain")
    verify.add_argument(
        "--hub",
        action="store_true",
        help="also ask the hub for each file's SHA-256 (the publisher's word; needs the network)",
    )
    verify.add_argument(
        "--forget-trusted",
        action="store_true",
        help="forget the hashes recorded on trust when a copy was added by hand",
    )
    verify.set_defaults(func=run_verify)


def _licence_text(entry) -> str:
    licence = entry.licence
    lines = [
        f"{entry.title} {entry.version} is under the {licence.name}",
        f"  {licence.url}",
        f"  applies to: {licence.applies_to}" if licence.applies_to else "",
        f"  {licence.summary}",
    ]
    if licence.text:
        lines.append(licence.text)
    if entry.pinning_note():
        lines.append(f"  Note: {entry.pinning_note()}.")
    return "\n".join(line for line in lines if line)


def _ask_licence(entry, args) -> bool:
    """Whether the licence is accepted: already, by --accept-licence, or by the user typing yes."""
    from engine.models.download import LicenceAcceptances

    store = LicenceAcceptances()
    if args.accept_licence or store.accepted(entry):
        return True
    _say(_licence_text(entry))
    if not sys.stdin.isatty():
        return False  # the caller's one-line refusal says to add --accept-licence
    answer = input("Accept this licence? Type yes to accept: ").strip().lower()
    if answer in ("y", "yes"):
        store.accept(entry)
        return True
    return False


class _Bar:
    """A byte progress line on stderr (a bar when stderr is a terminal, a line per 10 % otherwise)."""

    def __init__(self) -> None:
        self.stream = sys.stderr
        self.interactive = self.stream.isatty()
        self.last_tenth = -1
        self.text = ""

    def __call__(self, done: int, total: int, text: str) -> None:
        from engine.formatting import format_bytes

        if not total:  # still asking the hub: nothing to draw yet (a refusal then stays one line)
            return
        fraction = done / total
        bar = "#" * int(28 * fraction) + "-" * (28 - int(28 * fraction))
        line = f"[{bar}] {format_bytes(done)} of {format_bytes(total)}  {text}"
        if self.interactive:
            self.stream.write("\r" + line.ljust(len(self.text)))
            self.text = line
        elif int(fraction * 10) != self.last_tenth or text != self.text:
            self.last_tenth = int(fraction * 10)
            self.text = text
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.interactive:
            self.stream.write("\n")


def run_get(args) -> int:
    from engine.errors import Cancelled
    from engine.models.catalogue import check_name, find_entry
    from engine.models.download import LicenceNotAccepted, get_model

    entry = find_entry(check_name(args.name))
    if not _ask_licence(entry, args):
        raise LicenceNotAccepted(
            f"the {entry.licence.name} was not accepted, so nothing was fetched; read it at {entry.licence.url} "
            f"and run `volsynth models get {entry.name} --accept-licence`"
        )
    bar = _Bar()
    try:
        folder = get_model(entry, accept_licence=True, progress=bar)
    except (KeyboardInterrupt, Cancelled):
        bar.close()
        _say(f"volsynth: stopped; run `volsynth models get {entry.name}` again to resume", file=sys.stderr)
        return 130
    bar.close()
    _print_installed(folder)
    return 0


def run_add(args) -> int:
    from engine.models.catalogue import find_entry
    from engine.models.download import LicenceNotAccepted, add_folder

    entry = find_entry(args.model) if args.model else None
    if entry is not None and not _ask_licence(entry, args):
        raise LicenceNotAccepted(
            f"the {entry.licence.name} was not accepted, so nothing was copied; read it at {entry.licence.url} "
            "and add --accept-licence"
        )
    folder = add_folder(args.folder, entry, accept_licence=entry is not None)
    _print_installed(folder)
    if entry is not None:
        _say(
            "  its hub files' SHA-256 are recorded on trust: nothing checked them against the publisher, and "
            f"the hub's own hashes outrank them (forget them: volsynth models verify {entry.name} "
            "--forget-trusted)"
        )
    return 0


def run_remove(args) -> int:
    from engine.models.catalogue import check_name, find_entry
    from engine.models.installed import remove_installed

    entry = find_entry(check_name(args.name))
    removed, forgotten = remove_installed(entry)
    forgot = f"forgot its recorded hashes ({', '.join(forgotten)})" if forgotten else ""
    if removed is None:
        _say(f"{entry.name} is not installed; {forgot}")
    else:
        _say(f"removed {removed}" + (f"; {forgot}" if forgot else ""))
    return 0


def run_verify(args) -> int:
    from engine.errors import ModelInvalid
    from engine.models.catalogue import check_name, find_entry
    from engine.models.download import ON_TRUST, RecordedHashes
    from engine.models.installed import check_installed

    entry = find_entry(check_name(args.name))
    hashes = RecordedHashes()
    check = check_installed(entry, ask_hub=args.hub, hashes=hashes)
    if (
        check.problem is not None
    ):  # the loader's checks and every tensor's shape against the config's networks
        raise check.problem
    _say(f"{check.folder}: every weights file fits the networks its config describes")
    if args.hub:
        _say(f"  the hub: {'asked' if check.hub == 'asked' else 'not reached (' + check.hub + ')'}")
    for file in check.files:
        _say(f"  {file.words()}")
    if check.confirmed:
        _say(f"  the hub confirmed what was kept on trust: {', '.join(check.confirmed)}")
    if args.forget_trusted:
        gone = hashes.forget(entry, ON_TRUST)
        _say(
            f"forgot the hashes recorded on trust: {', '.join(gone)}"
            if gone
            else "no hash was recorded on trust"
        )
    if check.wrong:
        wrong = "; ".join(f.words().replace("  ", " ") for f in check.wrong)
        raise ModelInvalid(f"{entry.name} in {check.folder} is not as published: {wrong}")
    return 0


def _print_installed(folder) -> None:
    from engine.models.download import PROVENANCE_FILE
    from engine.models.registry import open_model_folder

    source = open_model_folder(folder)
    _say(f"installed {source.spec.name} as {source.id} in {folder}")
    record = folder / PROVENANCE_FILE
    if record.is_file():
        provenance = json.loads(record.read_text(encoding="utf-8"))
        for path, info in provenance.get("files", {}).items():
            _say(f"  {path}  sha256 {info['sha256']}  (checked against {info['checked_against']})")
        licence = provenance.get("licence", {})
        _say(f"  licence: {licence.get('name')} ({licence.get('url')})")
        if licence.get("bundle_metadata"):
            _say(f"  the bundle's metadata says: {licence['bundle_metadata']}")
    _say(f"  generate with: volsynth generate --model {source.id}")


def _not_guaranteed(spec) -> list[str]:
    """The catalogue's caveats for the modalities this installed model offers (NV-Generate: SWI planes)."""
    from engine.errors import EngineError
    from engine.models.catalogue import load_catalogue

    layout = {"nv-generate": "nv-generate"}.get(spec.source)
    try:
        entries = [e for e in load_catalogue() if e.layout == layout] if layout else []
    except EngineError:
        return []
    offered = set(spec.modality_names)
    return [
        f"{m['name']} ({m['not_guaranteed']})"
        for entry in entries[:1]
        for m in entry.makes.get("modalities", [])
        if m.get("not_guaranteed") and m["name"] in offered
    ]


def _catalogue_lines(installed_ids: set[str]) -> list[str]:
    from engine.errors import EngineError
    from engine.formatting import format_bytes
    from engine.models.catalogue import load_catalogue
    from engine.models.download import is_installed, staged_bytes

    try:
        entries = load_catalogue()
    except EngineError as exc:
        return [f"(the model catalogue cannot be read: {exc})"]
    lines = []
    for entry in entries:
        if entry.folder in installed_ids or is_installed(entry):
            continue
        needs = ", ".join(
            f"{'x'.join(map(str, n['size']))}: about {format_bytes(n['total'])}" for n in entry.memory_needs()
        )
        staged = staged_bytes(entry)
        resume = f"; {format_bytes(staged)} already fetched, get resumes" if staged else ""
        lines += [
            f"{entry.name}  [can be fetched: volsynth models get {entry.name}]",
            f"  {entry.title} {entry.version}: {entry.summary}",
            f"  download about {format_bytes(entry.weight_bytes_estimate())}{resume}; "
            f"licence: {entry.licence.name} ({entry.licence.url})",
            f"  memory per volume: {needs}",
        ]
        if entry.pinning_note():
            lines.append(f"  {entry.pinning_note()}")
        if entry.not_guaranteed():
            lines.append(f"  quality not guaranteed by its owners: {', '.join(entry.not_guaranteed())}")
    return lines


def run(args) -> int:
    from engine.models.registry import DEFAULT_MODEL_ID, ModelRegistry

    registry = ModelRegistry()
    sources = registry.list()
    if args.json:
        listing = [{**s.spec.to_dict(), "path": str(s.path)} for s in sources]
        listing += [{"id": b.name, "path": str(b.path), "broken": b.reason} for b in registry.broken]
        _say(json.dumps(listing, indent=2))
        return 0
    if not sources:
        _say("No models found. Searched: " + ", ".join(str(p) for p in registry.search_path))
    for source in sources:
        spec = source.spec
        default = "  [default]" if spec.id == DEFAULT_MODEL_ID else ""
        shape = "x".join(str(s) for s in spec.output_shape[1:])
        spacing = "x".join(f"{s:g}" for s in spec.voxel_spacing_mm)
        _say(f"{spec.id}{default}")
        _say(f"  {spec.name}  ({spec.kind}, {shape} voxels at {spacing} mm, {source.path})")
        _say(
            f"  samplers: {', '.join(spec.samplers)} (default {spec.default_sampler}, {spec.default_steps} steps)"
            + ("; classifier-free guidance" if spec.supports_guidance else "")
        )
        if spec.modalities:
            _say(f"  --modality {{{','.join(spec.modality_names)}}}  (default {spec.default_modality})")
            caveats = _not_guaranteed(spec)
            if caveats:
                _say(f"  quality not guaranteed by its owners: {', '.join(caveats)}")
        if spec.geometry:
            geometry = spec.geometry
            preview = geometry.get("preview") or {}
            largest = "x".join(str(v) for v in geometry["max_size"])
            small = "x".join(str(v) for v in preview.get("size", ()))
            small_spacing = "x".join(f"{v:g}" for v in preview.get("spacing_mm", ()))
            _say(
                f"  --size / --spacing: multiples of {geometry['size_multiple']} voxels up to {largest}; "
                f"--preview-size: {small} at {small_spacing} mm"
            )
            extra = spec.extra
            _say(f"  version {extra.get('version')}, licence: {extra.get('licence')}; no tissue maps")
        for cond in spec.conditioning:
            unit = f" {cond.unit}" if cond.unit else ""
            _say(
                f"  --cond {cond.name}=VALUE   {cond.label}: {cond.min:g} to {cond.max:g}{unit} "
                f"(default {cond.default:g})"
            )
    for broken in registry.broken:
        _say(f"{broken.name}  [broken, not usable]")
        _say(f"  {broken.path}: {broken.reason}")
    for line in _catalogue_lines({s.id for s in sources}):
        _say(line)
    return 0
