"""A model copy checked against the networks its own config describes, before it is called installed.

A folder brought by hand (``volsynth models add``, the app's Add from Folder) or fetched from a hub is
untrusted: file names prove nothing (a 6 MB file named like NVIDIA's U-Net was once accepted as the
installed NV-Generate-MR-Brain). So, for every network of the folder's spec:

1. the network is built on PyTorch's ``meta`` device (shapes only, no memory for weights), which gives the
   name and shape of every tensor it needs and the bytes they imply;
2. the weights file must hold at least those bytes at 16 bits per value, checked from its size before it is
   read (a file far smaller than its network cannot be it);
3. the file is read (tensors only, ``weights_only=True``) and every tensor the network needs must be there
   with exactly its shape.

Checkpoints in MONAI GenerativeModels' old layout (``load_old``) name their tensors differently; for those
the shapes are compared as a multiset.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from engine.errors import ModelInvalid
from engine.formatting import format_bytes

#: The fewest bytes a value takes in a weights file (fp16/bf16).
MIN_BYTES_PER_VALUE = 2

#: How a weights file fails its network (``CopyMismatch.problem``).
TOO_SMALL, MISSING_TENSOR, WRONG_SHAPE = "too small", "missing tensor", "wrong shape"


class CopyMismatch(ModelInvalid):
    """A weights file that does not belong to the network its folder's config describes.

    The message is the one line for a terminal; the fields let a front end say the same in its own words
    (which network, which file, how far off) without parsing it.
    """

    def __init__(
        self,
        message: str,
        *,
        role: str,
        file: str,
        problem: str,
        file_bytes: int,
        needed_bytes: int,
        tensors: int,
    ) -> None:
        super().__init__(message)
        self.role = role  # "unet", "autoencoder"...: the key of the spec's networks
        self.file = file  # the weights file's name
        self.problem = problem  # TOO_SMALL, MISSING_TENSOR or WRONG_SHAPE
        self.file_bytes = file_bytes
        self.needed_bytes = needed_bytes  # the least the network's weights take (16 bits each)
        self.tensors = tensors  # how many tensors the network has


def expected_tensors(definition: dict[str, Any], where: str) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor the network of ``definition`` holds (built on the meta device)."""
    import torch

    from engine.models import networks

    with torch.device("meta"):
        net = networks.build_network(definition, where=where)
    return {name: tuple(tensor.shape) for name, tensor in net.state_dict().items()}


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def check_copy(source) -> dict[str, int]:
    """Refuse ``source`` (an opened model folder) unless every weights file fits its network.

    Returns:
        role -> bytes the network's tensors imply at 32 bits per value (for the caller's message).

    Raises:
        CopyMismatch: A file is smaller than its network implies, lacks a tensor, or holds one of another
            shape; the message names the role, the file and the first difference.
    """
    implied: dict[str, int] = {}
    for role, path in sorted(source.weight_files.items()):
        definition = source.spec.networks.get(role)
        if definition is None:
            continue
        expected = expected_tensors(definition, f"networks.{role}")
        values = sum(_numel(shape) for shape in expected.values())
        implied[role] = 4 * values
        size = path.stat().st_size
        facts = {
            "role": role,
            "file": path.name,
            "file_bytes": size,
            "needed_bytes": MIN_BYTES_PER_VALUE * values,
            "tensors": len(expected),
        }
        if size < MIN_BYTES_PER_VALUE * values:
            raise CopyMismatch(
                f"{path.name} is {format_bytes(size)}, but the {role} its config describes has {values:,} "
                f"weights (at least {format_bytes(MIN_BYTES_PER_VALUE * values)} at 16 bits each): it is not "
                "this model's file; nothing was installed",
                problem=TOO_SMALL,
                **facts,
            )
        state = source.read_weights(role, path)  # each kind of folder reads its own layout
        got = {name: tuple(getattr(t, "shape", ())) for name, t in state.items()}
        if source.load_old:
            missing = Counter(expected.values()) - Counter(got.values())
            if missing:
                shape, _ = next(iter(missing.items()))
                raise CopyMismatch(
                    f"{path.name} lacks {sum(missing.values())} of the {role}'s {len(expected)} tensors by shape "
                    f"(first: {list(shape)}); it does not belong to the network its config describes; nothing "
                    "was installed",
                    problem=WRONG_SHAPE,
                    **facts,
                )
            continue
        for name, shape in expected.items():
            if name not in got:
                raise CopyMismatch(
                    f"{path.name} lacks the {role}'s tensor {name[:120]} (one of {len(expected)}); it does not "
                    "belong to the network its config describes; nothing was installed",
                    problem=MISSING_TENSOR,
                    **facts,
                )
            if got[name] != shape:
                raise CopyMismatch(
                    f"{path.name}: the {role}'s tensor {name[:120]} is {list(got[name])}, the network its config "
                    f"describes needs {list(shape)}; nothing was installed",
                    problem=WRONG_SHAPE,
                    **facts,
                )
    return implied


def load_refusal(source, exc: BaseException) -> ModelInvalid:
    """The error for weights that would not load into their networks (torch's ``size mismatch``, ``Missing
    key``): the copy check's finding (which file, which network, how far off) when it has one, else torch's
    own words cut at a word, never mid-word."""
    from engine.models.spec import one_line

    try:
        check_copy(source)
    except CopyMismatch as found:
        finding = str(found).removesuffix("; nothing was installed")
        return CopyMismatch(
            f"cannot load model {source.id!r}: its weights do not fit the networks its config describes "
            f"({finding}); remove this copy and install the model again",
            role=found.role,
            file=found.file,
            problem=found.problem,
            file_bytes=found.file_bytes,
            needed_bytes=found.needed_bytes,
            tensors=found.tensors,
        )
    except Exception:  # noqa: BLE001 - the check is only a better message; torch's own words follow
        pass
    text = one_line(str(exc))
    if len(text) > 300:
        text = text[:300].rsplit(" ", 1)[0] + " …"
    return ModelInvalid(f"cannot load model {source.id!r}: {text}")
