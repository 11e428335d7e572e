"""``volsynth generate``: sample volumes from a model and write NIfTI + provenance sidecar."""

from __future__ import annotations

from engine.cli._request import (
    add_backend_arguments,
    add_request_arguments,
    backend_from_args,
    request_from_args,
)
from engine.cli._settings import add_setting_arguments, print_prediction, setting_fields


def register(sub) -> None:
    parser = sub.add_parser("generate", help="generate synthetic volumes and save them as NIfTI")
    add_request_arguments(parser)
    opt = parser.add_argument_group("optimization (what applied is recorded in the sidecar)")
    add_setting_arguments(opt)
    opt.add_argument(
        "--settings",
        default=None,
        metavar="NAME|JSON|fastest-here",
        help="all optimization settings at once: a bench row name (volsynth bench --rows list), a JSON object "
        "of settings, or fastest-here (what volsynth tune measured fastest for this model on this machine); "
        "replaces the single-setting flags except --allow-slower",
    )
    parser.add_argument(
        "--tissue-maps",
        action="store_true",
        help="for a model that makes no tissue maps of its own (NV-Generate-MR-Brain, MONAI bundles): segment "
        "each volume into GM, WM, CSF and brain-mask maps (contrast from --modality; SWI is refused) written "
        "beside it as <stem>_label-<name>_probseg; a model with tissue channels keeps its own maps. A volume "
        "the method refuses (not brain-like) is written without maps, saying why",
    )
    add_backend_arguments(parser)
    parser.add_argument(
        "--out", required=True, help="output file, .nii.gz or .nii (a .json sidecar is written too)"
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    import signal
    import sys
    import threading

    from engine.api import drive
    from engine.cli._progress import ProgressLine
    from engine.nifti.io import batch_paths, check_output_path, generated_volumes, save_volumes, xform_code
    from engine.optimization.apply import OptimizationConfig

    optimization = OptimizationConfig(**setting_fields(args))
    if args.settings:  # the named settings replace every flag but the override's
        import dataclasses

        from engine.api.optimization_config import OVERRIDE, SETTING_ROWS
        from engine.cli._settings import settings_from_text

        overrides = setting_fields(args, [row for row in SETTING_ROWS if row.part == OVERRIDE])
        optimization = dataclasses.replace(settings_from_text(args.settings, args.model), **overrides)
    request = request_from_args(args, optimization)
    out = check_output_path(args.out)  # before any heavy work: fail in a second, not after minutes
    if args.tissue_maps and request.modality:
        from engine.anatomy.segment import contrast_from_modality

        contrast_from_modality(request.modality)  # SWI and the like end here, before minutes of sampling

    backend = backend_from_args(args)
    if not args.server:  # a server predicts (and refuses) with its own probe when the run starts
        print_prediction(request, args.device)
    from engine.telemetry import Sampler

    line = ProgressLine()
    metrics = Sampler()  # GPU/CPU use during the run, summarised into the provenance record
    metrics.start()
    metrics.mark_run_start("generate")
    # Ctrl-C asks the loop to stop at the next step (a flag, so it cannot be lost in a finaliser that
    # happens to be running when the signal lands); a second Ctrl-C interrupts at once.
    cancel = threading.Event()

    def on_sigint(signum, frame) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        result = drive(backend.sample(request), on_progress=line.update, should_stop=cancel.is_set)
    finally:  # drive() has closed the generator: the engine's clean-up ran
        signal.signal(signal.SIGINT, previous)
        line.close()
        summary = metrics.mark_run_end("generate")
        metrics.stop()
    if result is None:
        raise KeyboardInterrupt  # volsynth's main reports it: "cancelled", exit code 130
    result.provenance["telemetry"] = summary
    made_tissue = None
    if args.tissue_maps and result.label_names:
        print("tissue maps: the model's own (decoded channels); --tissue-maps keeps them", file=sys.stderr)
    elif args.tissue_maps:
        made_tissue = segment_members(result, request)
    checks = anatomy_checks(result, made_tissue)
    volumes = generated_volumes(result, made_tissue, [c.to_dict() if c else None for c in checks])
    paths = save_volumes(volumes, batch_paths(out, len(volumes)))
    timings = result.provenance["timings"]
    for path in paths:
        print(path)
    if result.label_names:  # stderr: stdout stays the list of images that scripts read
        names = ", ".join(result.label_names)
        print(f"tissue maps ({names}) beside each image as <stem>_label-<name>_probseg", file=sys.stderr)
    for path, (maps, record) in zip(paths, made_tissue or (), strict=False):
        if maps:
            print(
                f"tissue maps ({', '.join(maps)}) beside {path.name}, made by {record['method']} "
                f"({record['contrast']})",
                file=sys.stderr,
            )
        else:  # the volume is valid and written; only its maps are missing, so this is no failure
            print(
                f"no tissue maps for {path.name} (the volume is written): {record['tissue_maps_not_made']}",
                file=sys.stderr,
            )
    for path, check in zip(paths, checks, strict=True):
        if check is not None:
            print(f"{path.name}: {check.summary()}", file=sys.stderr)
    for warning in result.provenance.get("warnings") or ():
        print(f"warning: {warning}", file=sys.stderr)
    if result.space:
        print(f"space: {result.space} (sform code {xform_code(result.space)})", file=sys.stderr)
    print(
        f"done in {timings['total_s']:.1f} s (denoise {timings['denoise_s']:.1f} s, "
        f"decode {timings['decode_s']:.1f} s) on {result.provenance['device_name']}",
        file=sys.stderr,
    )
    return 0


def segment_members(result, request) -> list[tuple[dict, dict]]:
    """``(maps, record)`` per batch member of a result whose model makes no tissue maps: segmented with the
    contrast of the modality it was made in (a model that takes none is taken as T1w, as MONAI's brain bundles
    are), or no maps and why not."""
    import sys

    from engine.anatomy.segment import contrast_from_modality, maps_or_reason
    from engine.errors import InvalidRequest

    modality = (result.provenance.get("output") or {}).get("modality") or request.modality
    try:
        contrast = contrast_from_modality(modality)
    except InvalidRequest as exc:  # the model's default modality was one the method refuses (SWI)
        return [({}, {"tissue_maps_not_made": str(exc)}) for _ in range(result.volumes.shape[0])]

    def on_stage(stage: str, fraction: float) -> None:
        print(f"tissue maps: {stage} ({fraction:.0%})", file=sys.stderr, flush=True)

    return [
        maps_or_reason(result.volume(index), result.affine, contrast, on_stage=on_stage)
        for index in range(result.volumes.shape[0])
    ]


def anatomy_checks(result, made_tissue) -> list:
    """The anatomy check of each batch member that has tissue maps (the model's own channels, or segmented), or
    that segmentation refused as no brain; None for one with nothing to check (``engine.anatomy.checks``)."""
    from engine.anatomy.checks import check_from_record

    checks = []
    for index in range(result.volumes.shape[0]):
        if result.label_names:
            maps, record = result.tissue_maps(index), result.tissue_maps_made
        elif made_tissue is not None:
            maps, record = made_tissue[index]
        else:
            maps, record = {}, None
        checks.append(check_from_record(maps, result.affine, record, space=result.space))
    return checks
