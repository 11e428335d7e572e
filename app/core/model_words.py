"""What the app says about model copies and the model hub, in the words of the person at the workstation.

The engine's messages are written for a terminal (file paths inside a repository, environment variables, the
command to run next). The app has buttons instead, and its users are clinicians and imaging staff: these
functions word the same facts (the engine's errors carry them as fields) for the Get Models dialog and the
model picker. Qt-free, so they are tested as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from engine.formatting import format_bytes
from engine.models.copy_check import TOO_SMALL

# The networks of a model folder (the spec's keys) by what they do for the user.
ROLE_WORDS = {
    "unet": "image generator (its U-Net)",
    "autoencoder": "image decoder (its autoencoder)",
    "controlnet": "conditioning network (its ControlNet)",
}


def role_words(role: str) -> str:
    return ROLE_WORDS.get(role, f"{role} network")


def hub_file_url(file: Any, endpoint: str = "https://huggingface.co") -> str:
    """The address a person downloads a catalogue file from in a browser."""
    return f"{endpoint.rstrip('/')}/{file.repo}/resolve/{file.revision}/{file.filename}"


def copy_refusal(exc: Any, title: str) -> str:
    """A copy whose weights do not fit the model's networks (``engine.models.copy_check.CopyMismatch``)."""
    what = role_words(exc.role)
    if exc.problem == TOO_SMALL:
        why = (
            f"its {what} file, {exc.file}, holds {format_bytes(exc.file_bytes)}, but this model's {what.split(' (')[0]} "
            f"needs at least {format_bytes(exc.needed_bytes)}: it is a different or incomplete file"
        )
    else:
        why = (
            f"its {what} file, {exc.file}, was made for a network of another design (its layers do not have the "
            "sizes this model's configuration gives them)"
        )
    return (
        f"This copy is not {title}: {why}. Nothing was installed. Use the files exactly as their publisher "
        "distributes them (Get fetches them when this computer can reach the model hub)."
    )


def copy_incomplete(missing: Sequence[str], title: str) -> str:
    """A folder that lacks some of the model's files (``engine.models.download.CopyIncomplete``)."""
    names = ", ".join(Path(path).name for path in missing)
    return (
        f"The chosen folder does not hold every file of {title}: {names} is missing (looked for in the folder "
        "and in its models subfolder). Nothing was installed. Choose the folder that holds all of them."
    )


def _reason_words(reason: str) -> str:
    text = reason.lower()
    if "offline" in text:
        return "VolSynth is set to work offline"
    if "proxy" in text:
        return "the network's proxy did not let the request through"
    if "refused" in text:
        return "the connection was refused"
    if "timed out" in text or "timeout" in text:
        return "it did not answer in time"
    if "name" in text and ("resolv" in text or "known" in text or "getaddrinfo" in text):
        return "its address could not be looked up (is this computer connected to the internet?)"
    if "ssl" in text or "certificate" in text:
        return "its secure connection could not be checked (a network filter may be in the way)"
    return "the connection failed"


def hub_unreachable(exc: Any, title: str) -> str:
    """The hub could not be reached (``engine.models.download.HubUnreachable``): what to do instead, with the
    buttons this dialog has. The transport's own words go to the tooltip (for whoever runs the network)."""
    host = urlparse(exc.endpoint or "").hostname or "huggingface.co"
    return (
        f"The model hub ({host}) cannot be reached from this computer: {_reason_words(exc.reason or '')}. "
        f"To install {title} without it: on a computer with internet access, download the files listed under "
        "Files (each name is a link), copy them into one folder, bring that folder here (a USB stick will do) "
        "and press Add from Folder. Get resumes from where it stopped once the hub can be reached."
    )


def check_words(check: Any, title: str) -> str:
    """What Verify found (``engine.models.installed.InstalledCheck``), one sentence per finding."""
    from engine.models.copy_check import CopyMismatch
    from engine.models.installed import DIFFERS, MATCHES, MISSING, ON_TRUST_ONLY, UNCHECKED

    if check.problem is not None:
        if isinstance(check.problem, CopyMismatch):
            why = copy_refusal(check.problem, title).split(". Nothing was installed.")[0]
        else:
            why = f"VolSynth cannot open it ({check.problem})"
        lines = [
            f"{title} as installed cannot generate. {why}. Remove it, then Get it or Add from Folder again."
        ]
    else:
        lines = [f"Verified {title}: its weights fit the networks its configuration describes."]
    hub = (
        ""
        if check.hub in ("", "asked")
        else f" The model hub could not be asked: {_reason_words(check.hub)}."
    )
    for file in check.files:
        name = Path(file.path).name
        if file.state == MATCHES:
            against = "its publisher's SHA-256 on the model hub" if "hub" in file.against else file.against
            if name in {Path(p).name for p in check.confirmed}:
                against += " (it was kept on trust; now checked)"
            lines.append(f"{name} matches {against}.")
        elif file.state == DIFFERS:
            lines.append(
                f"{name} is NOT the file its publisher distributes (it differs from {file.against})."
            )
        elif file.state == MISSING:
            lines.append(f"{name} is missing.")
        elif file.state == ON_TRUST_ONLY:
            lines.append(
                f"{name}: its SHA-256 is kept on trust (added by hand; nothing checked it against its publisher). "
                "Verify checks it against the model hub when this computer can reach it."
            )
        elif file.state == UNCHECKED:
            lines.append(f"{name}: no published SHA-256 to check it against.")
    return " ".join(lines) + hub


def picker_labels(sources: Sequence[Any]) -> list[str]:
    """The model picker's text for each of ``sources``: its name, and where two share a name, the folder it
    came from as well ("NV-Generate-MR-Brain ... v1 · nv-generate-mr-brain"), so no two entries read alike."""
    names = [source.spec.name for source in sources]
    labels = []
    for source, name in zip(sources, names, strict=True):
        if names.count(name) < 2:
            labels.append(name)
            continue
        path = getattr(source, "path", None)
        where = Path(path).name if isinstance(path, Path) else str(getattr(source, "id", ""))
        labels.append(f"{name} \u00b7 {where}")
    # The same name in two folders of the same name (two search folders): the parent folder tells them apart.
    for index, label in enumerate(labels):
        if labels.count(label) > 1:
            path = getattr(sources[index], "path", None)
            if isinstance(path, Path):
                labels[index] = f"{names[index]} \u00b7 {path.parent.name}/{path.name}"
    return labels
