"""MODEL_CARD.md of the shipped demo model, rendered from its spec (training provenance) and evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The permission notice of the ICBM 2009 (MNI152 nonlinear 2009) templates, as distributed by the
# McConnell Brain Imaging Centre with the template files. nilearn's own description of the data set
# (nilearn/datasets/description/icbm152_2009.rst) lists the licence as "unknown", so we quote the
# original notice and say so.
ICBM_NOTICE = """\
Copyright (C) 1993-2009 Louis Collins, McConnell Brain Imaging Centre, Montreal Neurological Institute,
McGill University. Permission to use, copy, modify, and distribute this software and its documentation
for any purpose and without fee is hereby granted, provided that the above copyright notice appear in all
copies. The authors and McGill University make no representations about the suitability of this software
for any purpose. It is provided "as is" without express or implied warranty. The authors are not
responsible for any data loss, equipment damage, property loss, or injury to subjects or patients
resulting from the use or misuse of this software package."""


def _prediction(cfg: dict) -> str:
    kind = cfg.get("prediction_type", "epsilon")
    return "v-prediction (Salimans & Ho 2022)" if kind == "v_prediction" else f"{kind} prediction"


def _min_snr(cfg: dict) -> str:
    gamma = cfg.get("min_snr_gamma", 0)
    return f" with Min-SNR-{gamma:g} weighting (Hang et al. 2023)" if gamma else ""


def _init_sigma(cfg: dict) -> str:
    sigma = cfg.get("ae_init_sigma")
    return f", posterior sigma initialised to {sigma:g}" if sigma else ""


def _channels(spec) -> str:
    if not spec.label_channels:
        return ""
    return f" (the image and the {', '.join(spec.label_channels)} maps, encoded and decoded together)"


def _adversarial(cfg: dict) -> str:
    parts = []
    if cfg.get("tissue_weight"):
        parts.append(f" + {cfg['tissue_weight']:g} x L1 of the tissue maps")
    if cfg.get("adv_weight"):
        parts.append(
            f" + {cfg['adv_weight']:g} x least-squares adversarial loss of a MONAI `PatchDiscriminator` "
            f"({cfg.get('disc_channels', '?')} channels, 3 layers, instance norm, AdamW lr "
            f"{cfg.get('disc_lr', '?')}) on the image channel from step "
            f"{int(cfg.get('adv_start', 0) * cfg.get('ae_steps', 0))} on, and during the decoder fine-tuning"
        )
    return "".join(parts)


def _parts(prov: dict) -> str:
    parts = prov.get("parts") or []
    if not parts:
        return ""
    listed = "; ".join(f"part {i}: {_fmt_seconds(p['seconds'])}" for i, p in enumerate(parts, start=1))
    return f"\n- Parts (each invocation, at most 2 hours): {listed}; total {_fmt_seconds(sum(p['seconds'] for p in parts))}."


def _fmt_seconds(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def _metrics_section(ev: dict[str, Any] | None) -> str:
    """The card's evaluation: the metric table, then notes on the sweep, the rulers, the run and any misses."""
    if not ev:
        return (
            "Not evaluated yet. Run `volsynth evaluate brain-t1-demo`; it fills in this section and "
            "writes `evaluation.json`.\n"
        )
    m = ev["metrics"]
    lines = ["| Metric | Value | Target | Pass |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {'yes' if d else '**no**'} |" for a, b, c, d in _metric_rows(m)]
    lines += _sweep_notes(m) + _ruler_notes(m) + _run_notes(ev) + _missed_targets(m)
    return "\n".join(lines) + "\n"


def _metric_rows(m: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """One (metric, value, target, pass) row per evaluated metric, in the card's order."""
    rows = [
        (
            f"Brain-mask Dice vs MNI152 mask (Otsu-thresholded samples, mean of {m['dice']['n']})",
            f"{m['dice']['mean']:.3f} (min {m['dice']['min']:.3f})",
            f">= {m['dice']['target']}",
            m["dice"]["pass"],
        ),
        (
            "GM / WM histogram modes inside the brain",
            f"GM {m['contrast']['gm_mode']:.3f}, WM {m['contrast']['wm_mode']:.3f}, dip ratio "
            f"{m['contrast']['dip_ratio']:.2f}",
            f"two modes, dip ratio <= {m['contrast']['dip_target']}",
            m["contrast"]["pass"],
        ),
        (
            f"Diversity: mean pairwise SSIM across {m['diversity']['n']} seeds",
            f"{m['diversity']['mean_ssim']:.3f}",
            f"< {m['diversity']['max_ssim']}",
            m["diversity"]["pass"],
        ),
        (
            "Conditioning: Spearman(requested, measured ventricle volume)",
            f"{m['conditioning']['spearman']:.3f}",
            f">= {m['conditioning']['target']}",
            m["conditioning"]["pass"],
        ),
        (
            "Finite output (no NaN/inf)",
            "yes" if m["finite"]["pass"] else "NO",
            "all finite",
            m["finite"]["pass"],
        ),
    ]
    if "sharpness" in m:
        sharp = m["sharpness"]
        recon = (
            f"; autoencoder reconstructions {sharp['reconstructions_sigma']:.2f}"
            if "reconstructions_sigma" in sharp
            else ""
        )
        rows.append(
            (
                "Sharpness: blur equivalence (Gaussian sigma, voxels, at which training volumes lose as much "
                "edge contrast as the samples)",
                f"samples {sharp['samples_sigma']:.2f}{recon}",
                f"<= {sharp['target']}",
                sharp["pass"],
            )
        )
    if "tissue_maps" in m:
        t = m["tissue_maps"]
        rows.append(
            (
                "Tissue maps vs the image: Dice of their hard labels against a 3-class k-means of the image "
                "inside the brain (GM / WM / CSF)",
                f"{t['dice_vs_kmeans']['GM']:.3f} / {t['dice_vs_kmeans']['WM']:.3f} / "
                f"{t['dice_vs_kmeans']['CSF']:.3f}",
                f"GM and WM >= {t['target']}",
                min(t["dice_vs_kmeans"]["GM"], t["dice_vs_kmeans"]["WM"]) >= t["target"],
            )
        )
        rows.append(
            (
                "Tissue maps vs the request: Spearman(requested ventricle volume, ventricle label volume)",
                f"{t['ventricle_label_spearman']:.3f}",
                f">= {t['spearman_target']}",
                t["ventricle_label_spearman"] >= t["spearman_target"],
            )
        )
    return rows


def _sweep_notes(m: dict[str, Any]) -> list[str]:
    """The ventricle sweep as requested -> measured (and -> label) volumes, and what the label is good for."""
    lines: list[str] = []
    sweep = m["conditioning"]
    lines.append("")
    lines.append(
        "Ventricle sweep (requested -> measured mL, mean over seeds): "
        + ", ".join(
            f"{r:.0f} -> {v:.1f}"
            for r, v in zip(sweep["requested_ml"], sweep["measured_ml_mean"], strict=True)
        )
    )
    if "tissue_maps" in m:
        t = m["tissue_maps"]
        lines.append("")
        lines.append(
            "Ventricle volume of the generated ventricle label (requested -> label mL, mean over seeds): "
            + ", ".join(
                f"{r:.0f} -> {v:.1f}"
                for r, v in zip(sweep["requested_ml"], t["ventricle_label_ml_mean"], strict=True)
            )
        )
    if "tissue_maps" in m:
        req = sum(sweep["requested_ml"]) / len(sweep["requested_ml"])
        lab = sum(t["ventricle_label_ml_mean"]) / len(t["ventricle_label_ml_mean"])
        lines.append(
            f"The ventricle label (voxels with probability > 0.5) follows the request in order but not in size: "
            f"over the sweep it holds {lab / req:.0%} of the requested volume on average, because the decoded "
            "ventricle map is soft at its edges. Use it to rank or to seed a segmentation, not as a volume "
            "measurement."
        )
    return lines


def _ruler_notes(m: dict[str, Any]) -> list[str]:
    """How the rulers themselves were checked: the measurement check and the sharpness ruler's scores."""
    lines: list[str] = []
    sweep = m["conditioning"]
    check = sweep.get("measurement_check", {})
    if check.get("kmeans_vs_true_maps_dice"):
        k = check["kmeans_vs_true_maps_dice"]
        lines.append("")
        lines.append(
            f"The rulers checked on {check['n']} labelled synthetic volumes (seeds outside training): "
            f"ventricle volume measured on the image vs the label, Spearman "
            f"{check['spearman_label_vs_measured']:.3f}; the k-means classes vs the true tissue maps, Dice GM "
            f"{k['GM']:.3f}, WM {k['WM']:.3f}, CSF {k['CSF']:.3f} (the ceiling of the tissue-map agreement)."
        )
    if "sharpness" in m:
        sharp = m["sharpness"]
        lines.append("")
        lines.append(
            "Sharpness ruler: gradient energy (mean squared gradient) inside the brain (eroded 3 voxels) per squared unit of the "
            "brain's 5-95th percentile intensity spread, on 8 held-out training-like volumes blurred by "
            + ", ".join(f"{s:g}" for s in sharp["sigmas"])
            + " voxels: "
            + ", ".join(f"{v:.4f}" for v in sharp["training_scores"])
            + f"; samples score {sharp['sample_score']:.4f}"
            + (
                f", autoencoder reconstructions {sharp['reconstruction_score']:.4f}"
                if "reconstruction_score" in sharp
                else ""
            )
            + "."
        )
    return lines


def _run_notes(ev: dict[str, Any]) -> list[str]:
    """How the evaluation sampled, how long it took where, and the fresh-process inference timing."""
    lines: list[str] = []
    lines.append("")
    lines.append(
        f"Sampling for the evaluation: {ev['sampling']}. Evaluation took {_fmt_seconds(ev['seconds'])} "
        f"on {ev['machine']}."
    )
    if ev.get("inference"):
        inf = ev["inference"]
        lines.append("")
        lines.append(
            f"Inference on this CPU (one volume, {inf['steps']} DDIM steps + decode, "
            f"{inf['threads']} threads): {inf['seconds']:.1f} s wall clock while the shared machine's "
            f"load average was {inf.get('load_average_1min', float('nan')):.1f} "
            f"({inf.get('cpu_seconds', float('nan')):.1f} CPU-seconds, i.e. about "
            f"{inf.get('idle_estimate_s', float('nan')):.1f} s on an idle 2-core machine); "
            f"peak RSS {inf['peak_rss_gb']:.2f} GB."
        )
    return lines


def _missed_targets(m: dict[str, Any]) -> list[str]:
    """The targets missed, each with what is known of why."""
    lines: list[str] = []
    reasons = {
        "contrast": (
            "grey and white matter differ visibly in the samples (see the montage), but the histogram of "
            "intensities inside the brain shows a WM shoulder, not a dip between two peaks. The training "
            "volumes have the dip, and the sharpness row shows the samples are not simply blurred; what "
            "fills the dip was not established (the partial-volume voxels of the 2 mm GM/WM boundary are "
            "one candidate)"
        ),
        "conditioning": (
            "the ventricle condition moves the anatomy less than seed-to-seed variation does; "
            "a higher guidance scale strengthens it"
        ),
        "sharpness": (
            "the samples are blurrier than the target; the autoencoder's reconstructions and the samples "
            "are listed separately above, so the share of each is visible"
        ),
    }
    misses = [
        key
        for key in ("dice", "contrast", "sharpness", "tissue_maps", "diversity", "conditioning", "finite")
        if key in m and not m[key]["pass"]
    ]
    if misses:
        lines.append("")
        lines.append(
            "**Targets missed:** "
            + "; ".join(f"{key}: {reasons.get(key, 'see the table')}" for key in misses)
            + ". See docs/shipped-model.md, the shipped model's status, for what was tried."
        )
    return lines


def _ablation_section(folder: str | Path | None) -> str:
    """The sharpness of each training stage (``volsynth evaluate --ablation-work``), if it was measured."""
    if folder is None or not (Path(folder) / "sharpness_ablation.json").exists():
        return ""
    import json

    ab = json.loads((Path(folder) / "sharpness_ablation.json").read_text())
    rows = "\n".join(
        f"| {name} | {value:.2f} |" if value != float("inf") else f"| {name} | > {ab['sigmas'][-1]:g} |"
        for name, value in ab["blur_equivalence"].items()
    )
    picture = (
        "\n\n![Before and after](before_after.png)\n\n`before_after.png`: 8 samples of the previous shipped "
        "model (top) and of this one (bottom), same seeds and slices."
        if (Path(folder) / "before_after.png").exists()
        else ""
    )
    return f"""
## What each change bought (sharpness)

Blur equivalence (voxels; the ruler of the evaluation's sharpness row, on the same 8 held-out volumes) of
autoencoder reconstructions after each training stage and of samples, measured by
`volsynth evaluate --ablation-work WORK --baseline PREVIOUS` (baseline: {ab.get("baseline") or "none"}):

| Stage | Blur equivalence |
|---|---|
{rows}{picture}

0.00 means "at least the training volumes' edge energy", not "perfect": the patch-trained autoencoder's
whole-volume reconstructions carry high-frequency artefacts (their whole-volume L1 is far above the
fine-tuned decoder's, see Architecture) that the gradient-energy ruler counts as edges. The montages are
the check on what the numbers cannot tell apart.
"""


def render_card(spec, folder: str | Path | None = None, evaluation: dict[str, Any] | None = None) -> str:
    """The model card as Markdown: one section after another, each rendered by its own function below.

    Args:
        spec: the model's ModelSpec; its ``extra["training"]`` holds the provenance written by training.
        folder: the model folder (only used to mention the montage if it exists).
        evaluation: the dict ``volsynth evaluate`` writes to ``evaluation.json``, if there is one.
    """
    prov = spec.extra.get("training", {})
    return (
        _opening(spec, folder)
        + _training_data_section(prov)
        + _conditioning_section(spec, prov.get("data", {}))
        + _architecture_section(spec, prov)
        + _provenance_section(prov)
        + f"## Evaluation\n\n{_metrics_section(evaluation)}{_ablation_section(folder)}\n"
        + _licence_section()
    )


def _opening(spec, folder: str | Path | None) -> str:
    """Title, what the model is, where its voxels lie, its intended use, and the montage if there is one."""
    montage = ""
    if folder is not None and (Path(folder) / "montage.png").exists():
        overlay = (
            " The lower three rows show the same slices with the tissue labels generated with each image "
            "(the most likely of GM orange, WM blue, CSF cyan-green; ventricles purple), 45% opacity, the app's overlay colours."
            if spec.label_channels
            else ""
        )
        montage = (
            "\n![Mid-slices of 8 samples](montage.png)\n\n`montage.png`: axial, coronal and sagittal "
            "mid-slices of 8 samples (seeds 0-7, default conditions), radiological display (patient "
            f"left on the image right; anterior up in axial, superior up in coronal and sagittal).{overlay}\n"
        )
    if spec.space:
        origin = ", ".join(f"{v:g}" for v in spec.affine()[:3, 3])
        where = (
            f"in `{spec.space}` space (the ICBM 2009a symmetric MNI152 template's own 2 mm grid, cropped; "
            f"voxel (0, 0, 0) at ({origin}) mm; NIfTI sform code 4 = MNI152, qform code 1)"
        )
    else:
        where = "(RAS; the affine from the spec centres the volume at the origin)"
    tissue = ""
    if spec.label_channels:
        tissue = (
            f"\n\nEvery image comes with {len(spec.label_channels)} paired tissue maps decoded from the same "
            f"latent ({', '.join(spec.label_channels)}; probabilities in [0, 1]), written beside the image as "
            "BIDS-derivative `<stem>_label-<name>_probseg.nii.gz` files with the same affine, kept with it in "
            "the vault and in cohorts, and shown as a coloured overlay in the viewer. The decoded channels are "
            "made a partition (GM + WM + CSF + background = 1 in every voxel): each clipped to [0, 1], tissue "
            "outside the largest region where GM + WM + CSF >= 0.5 (grown by 2 voxels) set to background, sums "
            "over 1 divided by the sum, ventricles clipped to CSF (`engine/anatomy/partition.py`; the maps' "
            "sidecar says so under `tissue_maps_made.partition`)."
        )
    return f"""# {spec.name}

`{spec.id}`: the model VolSynth Studio ships as its default. A latent diffusion model that generates
skull-stripped T1-weighted brain MRI volumes, 80 x 96 x 80 voxels of 2 mm {where}, intensities in
[0, 1], conditioned on brain volume and ventricle volume.{tissue}

**Intended use: research, teaching and software testing. Not for diagnosis or any clinical decision.**
The training data are synthetic deformations of one population-average template, not images of real
people: anatomy is far less varied than real brains and pathology is absent.
{montage}
"""


def _training_data_section(prov: dict) -> str:
    """How the synthetic training volumes were made, with the synthesis ranges and the measured set."""
    from engine.training.synth import SynthConfig

    sc = SynthConfig()
    cfg = prov.get("config", {})
    data = prov.get("data", {})
    return f"""## Training data

{cfg.get("n_volumes", "?")} synthetic volumes from `engine/training/synth.py`, all derived from the MNI152
ICBM 2009a nonlinear template as shipped inside nilearn (files `mni_icbm152_{{t1,gm,wm}}_tal_nlin_sym_09a_
converted.nii.gz`, loaded with `nilearn.datasets.load_mni152_template`, `load_mni152_gm_template`,
`load_mni152_wm_template`, `load_mni152_brain_mask` at resolution 2 mm; nothing downloaded).
The template's tissue maps are an average over 152 brains and blurrier than any one brain, so GM, WM and
CSF probabilities are first sharpened once (p^4, renormalised) to give individual-scan-like boundaries.
Per volume:

1. Ventricle size: the ventricles (CSF in the central region of the eroded brain mask) grow by
   {sc.ventricle_dilation_vox[0]:g}-{sc.ventricle_dilation_vox[1]:g} voxels into the tissue around them (that
   tissue becomes CSF), then a smooth radial displacement centred on them (strength
   {sc.ventricle_strength[0]:g}..{sc.ventricle_strength[1]:g}) shrinks or expands them.
2. Brain size: isotropic scale {sc.iso_scale[0]:g}-{sc.iso_scale[1]:g} of the template (MONAI `Affine`), then
   MONAI `Rand3DElastic` (rotation <= {sc.rotate_deg:g} deg per axis, per-axis scale +-{sc.axis_scale:.0%},
   translation <= {sc.translate_vox:g} voxels, elastic sigma {sc.elastic_sigma[0]:g}-{sc.elastic_sigma[1]:g}
   voxels, magnitude {sc.elastic_magnitude[0]:g}-{sc.elastic_magnitude[1]:g} voxels).
3. Tissue intensities per class with T1 ordering: WM {sc.wm[0]:g}-{sc.wm[1]:g}, GM {sc.gm[0]:g}-{sc.gm[1]:g}
   (at least 0.18 below WM), CSF {sc.csf[0]:g}-{sc.csf[1]:g} (at least 0.15 below GM), background 0, mixed
   by the deformed partial-volume maps.
4. MONAI `RandBiasField` (degree 3, coefficients <= {sc.bias_coeff:g}), `RandGaussianSmooth` (sigma
   {sc.smooth_sigma[0]:g}-{sc.smooth_sigma[1]:g} voxels), `RandRicianNoise` (std
   {sc.noise_std[0]:g}-{sc.noise_std[1]:g}); clipped to [0, 1].

Brain volume (GM + WM) and ventricle volume are measured on each sample's deformed maps, and the deformed
GM, WM, CSF and ventricle maps are the paired labels the model learns to generate. Training set:
brain {data.get("brain_ml_min", 0):.0f}-{data.get("brain_ml_max", 0):.0f} mL (median
{data.get("brain_ml_median", 0):.0f}), ventricles {data.get("ventricle_ml_min", 0):.1f}-
{data.get("ventricle_ml_max", 0):.1f} mL (median {data.get("ventricle_ml_median", 0):.1f}).

"""


def _conditioning_section(spec, data: dict) -> str:
    """The conditions, their ranges (and any clipped in training), and how guidance uses them."""
    conds = "\n".join(
        f"- `{c.name}` ({c.label}, {c.unit}): range {c.min:g}-{c.max:g}, default {c.default:g}. "
        f"{c.description}"
        for c in spec.conditioning
    )
    clipped = []
    for c, key in ((spec.conditioning[0], "brain_ml"), (spec.conditioning[1], "ventricle_ml")):
        if data.get(f"{key}_max", c.max) > c.max or data.get(f"{key}_min", c.min) < c.min:
            clipped.append(
                f"`{c.name}`: training values span {data[f'{key}_min']:.0f}-{data[f'{key}_max']:.0f} "
                f"{c.unit}, beyond the range {c.min:g}-{c.max:g}; the few outside it (99th percentile "
                f"{data[f'{key}_p99']:.0f}) were trained with the condition clipped to the range"
            )
    clip_note = ("\n\nClipped conditions: " + "; ".join(clipped) + ".") if clipped else ""
    return f"""## Conditioning

{conds}{clip_note}

Values are mapped linearly to [0, 1] and given to the U-Net both as 2 constant input channels (concat)
and as cross-attention context, as in MONAI's brain latent-diffusion bundle. 10% of training samples had
both conditions replaced by the null value {spec.guidance_null_value}, so classifier-free guidance works
(`guidance_scale` > 1). The model samples with guidance scale {spec.default_guidance_scale:g} unless a
request sets another: the conditions then move the anatomy further than seed-to-seed variation does.

"""


def _architecture_section(spec, prov: dict) -> str:
    """The autoencoder, latent scale, U-Net and schedule, with the training settings of each."""
    cfg = prov.get("config", {})
    losses = prov.get("losses", {})
    ae = spec.networks["autoencoder"]
    unet = spec.networks["unet"]
    return f"""## Architecture

- Autoencoder: MONAI `AutoencoderKL`, channels {ae["channels"]}, {ae["latent_channels"]} latent channels,
  1 residual block per level, no attention; 4x downsampling, latent {list(spec.latent_shape)};
  {ae["in_channels"]} input and output channels{_channels(spec)}.
  Trained on random {cfg.get("ae_patch", "?")}^3 patches (batch {cfg.get("ae_batch", "?")}) for
  {prov.get("ae_steps", "?")} steps, AdamW lr {cfg.get("ae_lr", "?")} (cosine), loss L1 +
  {cfg.get("grad_weight", "?")} x image-gradient L1 + {cfg.get("kl_weight", "?")} x KL{_init_sigma(cfg)}{_adversarial(cfg)}; decodes
  whole volumes (it is fully convolutional). Whole-volume L1 on training volumes:
  {losses.get("ae_volume_l1", float("nan")):.4f} after patch training,
  {losses.get("ae_volume_l1_finetuned", float("nan")):.4f} after the whole-volume decoder fine-tuning
  ({prov.get("decoder_steps", "?")} steps, batch 1, AdamW lr {cfg.get("decoder_lr", 3e-4)}, encoder
  frozen).
- Latent scale factor: {spec.scale_factor:.4f} (= 1 / std of the encoded training latents).
- Diffusion U-Net: MONAI `DiffusionModelUNet`, channels {unet["channels"]}, attention (and cross-attention,
  {unet["num_head_channels"][-1]}-channel heads) on the last level only, 1 residual block per level,
  in_channels {unet["in_channels"]} ({ae["latent_channels"]} latent + 2 condition channels). {prov.get("unet_steps", "?")} steps,
  batch {cfg.get("unet_batch", "?")}, AdamW lr {cfg.get("unet_lr", "?")} (cosine), gradient clipping 1.0;
  {_prediction(cfg)}, MSE{_min_snr(cfg)}; exported weights are the EMA (decay {cfg.get("ema_decay", "?")}).
  Final smoothed training loss: {losses.get("unet_mse_ema", float("nan")):.4f}.
- Schedule: DDPM, {spec.schedule["num_train_timesteps"]} steps, scaled-linear betas
  {spec.schedule["beta_start"]}-{spec.schedule["beta_end"]}. Samplers: {", ".join(spec.samplers)};
  default {spec.default_sampler}, {spec.default_steps} steps.

"""


def _provenance_section(prov: dict) -> str:
    """How these weights were made: commands, seed, time per phase, machine, and how to reproduce them."""
    secs = prov.get("seconds", {})
    total = sum(secs.values())
    return f"""## How these weights were made

- Command(s), in order: {"; ".join(f"`{c}`" for c in prov.get("commands", [prov.get("command", "?")]))}{_parts(prov)}
- Seed: {prov.get("seed", "?")}; autoencoder {prov.get("ae_steps", "?")} steps, U-Net
  {prov.get("unet_steps", "?")} steps.
- Time: {_fmt_seconds(total)} in total (data {_fmt_seconds(secs.get("data", 0))}, autoencoder
  {_fmt_seconds(secs.get("ae", 0))}, latents {_fmt_seconds(secs.get("latents", 0))}, decoder fine-tuning
  {_fmt_seconds(secs.get("decoder", 0))}, U-Net
  {_fmt_seconds(secs.get("unet", 0))}).
- Machine: {prov.get("machine", "?")} (a 2-core CPU VM, no GPU).
- Phases: autoencoder on patches ({prov.get("ae_steps", "?")} steps), then the decoder fine-tuned on whole
  volumes with the encoder frozen ({prov.get("decoder_steps", "?")} steps; GroupNorm statistics of a whole
  volume differ from those of brain-centred patches, which made whole-volume decodes too bright by about
  0.2 before this fine-tuning), then the U-Net on the cached latents ({prov.get("unet_steps", "?")} of
  {prov.get("unet_steps_planned", "?")} planned steps).
- Reproduce: the commands above, in order, in the same `--work` folder (each `--resume` continues from the
  checkpoints the previous one left). A single uninterrupted run with the same result up to where the
  step counts were cut is `volsynth train-demo --seed 0 --ae-steps {prov.get("ae_steps", "?")} --decoder-steps
  {prov.get("decoder_steps", "?")} --unet-steps {prov.get("unet_steps", "?")}`; the data and every random
  draw come from the seed, and weights match up to the floating-point nondeterminism of multithreaded CPU
  kernels and the learning-rate schedules, which follow the planned step counts.
- Continue training: `volsynth train-demo --work WORK --resume --unet-steps N` (any N above the
  steps run) picks up the U-Net from its last checkpoint and re-exports the folder; then re-run
  `volsynth evaluate`.

"""


def _licence_section() -> str:
    """The template data's licence, quoting the ICBM notice as it requires."""
    return f"""## Licence of the template data

The training data derive from the MNI152 ICBM 2009 template. nilearn, which ships the files used, documents
the data set in `nilearn/datasets/description/icbm152_2009.rst` (see
http://www.bic.mni.mcgill.ca/ServicesAtlases/ICBM152NLin2009) and lists its licence as "unknown". The
McConnell Brain Imaging Centre publishes the ICBM 2009 templates (http://nist.mni.mcgill.ca/) with this
permission notice, reproduced here as it requires:

> {ICBM_NOTICE.replace(chr(10), chr(10) + "> ")}

References: Fonov et al., NeuroImage 54(1), 2011; Fonov et al., NeuroImage 47, S102, 2009; Collins et al.,
NeuroImage 1999.

The model weights are part of VolSynth Studio (Apache-2.0).
"""
