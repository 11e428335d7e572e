"""What this machine's hardware can run fast: one probe, and the decisions that follow from it.

Speed-ups measured on one machine are hypotheses on the next: bf16 autocast that runs at twice the fp32
rate on a CPU with AVX-512 BF16 falls back to a reference path on an AVX2-only CPU and runs 60-300x
slower. :func:`probe_machine` records what decides that (CPU vendor and model, the instruction sets oneDNN,
ATen and fbgemm will use, native bf16 / fp16 / int8-dot support, cores and memory; CUDA GPUs with their
compute capability; MPS; XLA) as a frozen, JSON-round-trippable :class:`MachineProbe`. The optimization
report (:mod:`engine.optimization.apply`) consults it, so "applies here" and "pays here" are decided in one
place: :func:`autocast_slower_reason` says why a precision is expected to run slower than fp32 here.

The probe honours the variables that make one machine stand in for another (``AVX2_STAND_IN``):
``ATEN_CPU_CAPABILITY`` (ATen's vectorised kernels), ``ONEDNN_MAX_CPU_ISA`` (oneDNN's convolutions and its
bf16 path), ``MKL_ENABLE_INSTRUCTIONS`` (MKL's fp32 matmuls) and ``FBGEMM_ENABLE_INSTRUCTIONS`` (fbgemm's
int8 kernels). Measured on an AMD EPYC (Zen 5, AVX-512 BF16): with all four set to AVX2, oneDNN reports no
bf16 and a 32-channel Conv3d under bf16 autocast takes 2.7 s against 0.009 s in fp32, as on a real AVX2
CPU. What they do not cover: the core count, clock, caches and memory bandwidth stay this machine's;
``/proc/cpuinfo`` still lists AVX-512 (the probe caps what it reports by the variables); numpy, scipy and
XLA's own code generation ignore them.

Tests feed recorded probes (:data:`RECORDED_PROBES`-style dicts through :meth:`MachineProbe.from_dict`)
instead of depending on the machine they run on.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass, field, replace
from typing import Any

AVX2_STAND_IN = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
}
STAND_IN_VARIABLES = tuple(AVX2_STAND_IN)

# oneDNN's CPU ISA levels, lowest first (the names ONEDNN_MAX_CPU_ISA takes), with the /proc/cpuinfo flags
# each needs on top of the level below it.
ONEDNN_ISAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SSE41", ("sse4_1",)),
    ("AVX", ("avx",)),
    ("AVX2", ("avx2", "fma")),
    ("AVX2_VNNI", ("avx_vnni",)),
    ("AVX512_CORE", ("avx512f", "avx512bw", "avx512vl", "avx512dq")),
    ("AVX512_CORE_VNNI", ("avx512_vnni",)),
    ("AVX512_CORE_BF16", ("avx512_bf16",)),
    ("AVX10_1_512", ("avx512_fp16",)),
    ("AVX10_1_512_AMX", ("amx_tile", "amx_int8", "amx_bf16")),
    ("AVX10_1_512_AMX_FP16", ("amx_fp16",)),
)
_ISA_NAMES = [name for name, _ in ONEDNN_ISAS]
_ISA_ALIASES = {
    "AVX512_CORE_FP16": "AVX10_1_512",
    "AVX512_CORE_AMX": "AVX10_1_512_AMX",
    "AVX512_CORE_AMX_FP16": "AVX10_1_512_AMX_FP16",
    "AVX2_VNNI_2": "AVX2_VNNI",
    "ALL": _ISA_NAMES[-1],
    "DEFAULT": _ISA_NAMES[-1],
}
# The flags worth recording (what the decisions below and oneDNN/fbgemm dispatch on).
RELEVANT_FLAGS = tuple(
    dict.fromkeys(f for _, flags in ONEDNN_ISAS for f in flags if f not in ("sse4_1", "avx"))
)


def _isa_rank(name: str | None) -> int:
    if not name:
        return len(_ISA_NAMES) - 1
    name = _ISA_ALIASES.get(name.strip().upper(), name.strip().upper())
    return _ISA_NAMES.index(name) if name in _ISA_NAMES else len(_ISA_NAMES) - 1


def hardware_isa(flags: set[str] | tuple[str, ...]) -> str:
    """The highest oneDNN ISA level the CPU flags support (levels build on each other)."""
    flags = set(flags)
    best = "SSE41" if "sse4_1" in flags else "none"
    for name, needs in ONEDNN_ISAS:
        if name == "AVX2_VNNI" and "avx512f" in flags:
            continue  # on AVX-512 parts AVX-VNNI is a side feature, not a level of its own
        if not set(needs) <= flags:
            if name == "AVX2_VNNI":
                continue  # AVX2 parts without AVX-VNNI still reach AVX-512 levels if they have them
            break
        best = name
    return best


@dataclass(frozen=True)
class CpuProbe:
    """The CPU as the kernels see it (after any stand-in variables)."""

    vendor: str
    model: str
    logical_cores: int
    torch_threads: int
    memory_bytes: int
    flags: tuple[str, ...]  # relevant /proc/cpuinfo flags present (RELEVANT_FLAGS)
    hardware_isa: str  # highest oneDNN ISA level the flags support
    onednn_isa: str  # what oneDNN will use: hardware_isa capped by ONEDNN_MAX_CPU_ISA
    torch_capability: str  # ATen's dispatch level ("AVX512", "AVX2", "DEFAULT"), ATEN_CPU_CAPABILITY included
    native_bf16: bool  # oneDNN has real bf16 kernels: AVX-512 BF16 or AMX-BF16 within onednn_isa
    emulated_bf16: bool  # AVX-512 without BF16: oneDNN converts to fp32 around each op
    native_fp16: bool  # AVX-512 FP16 or AMX-FP16 within onednn_isa
    int8_dot: str | None  # "AMX-INT8", "AVX512-VNNI", "AVX-VNNI" or None (int8 via AVX2 multiply-adds)
    int8_engine: str | None  # the quantized engine PyTorch will use ("x86", "fbgemm", "onednn") or None
    stand_in: dict[str, str] = field(default_factory=dict)  # stand-in variables set in this process

    @property
    def isa_summary(self) -> str:
        extras = [
            name
            for name, on in (
                ("native bf16", self.native_bf16),
                ("emulated bf16", self.emulated_bf16),
                ("native fp16", self.native_fp16),
            )
            if on
        ]
        if self.int8_dot:
            extras.append(f"int8 dot product {self.int8_dot}")
        return f"{self.onednn_isa}" + (f" ({', '.join(extras)})" if extras else " (no native bf16)")


@dataclass(frozen=True)
class GpuProbe:
    index: int
    name: str
    compute_capability: tuple[int, int]
    memory_bytes: int

    @property
    def tf32(self) -> bool:
        return self.compute_capability >= (8, 0)

    @property
    def bf16(self) -> bool:
        return self.compute_capability >= (8, 0)

    @property
    def fp16_tensor_cores(self) -> bool:
        return self.compute_capability >= (7, 0)

    @property
    def fp8(self) -> bool:
        return self.compute_capability >= (8, 9)

    @property
    def capability_text(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


@dataclass(frozen=True)
class MachineProbe:
    """Everything the optimization decisions need to know about this machine. JSON round-trippable."""

    cpu: CpuProbe
    gpus: tuple[GpuProbe, ...] = ()
    mps: bool = False
    xla: dict[str, Any] = field(default_factory=dict)  # {"jax_installed": bool, "tpu_present": bool}
    torch_version: str = ""

    def gpu(self, index: int | None) -> GpuProbe | None:
        for gpu in self.gpus:
            if gpu.index == (index or 0):
                return gpu
        return None

    def fingerprint(self) -> str:
        """Stable id of the hardware as the kernels see it: CPU model and ISA, cores, memory, GPUs.

        Measurements are kept per fingerprint, so a result from one machine (or from the AVX2 stand-in) is
        never taken for another's.
        """
        key = {
            "cpu": [self.cpu.vendor, self.cpu.model, self.cpu.onednn_isa, self.cpu.torch_capability],
            "cores": self.cpu.logical_cores,
            "memory_gib": round(self.cpu.memory_bytes / 2**30),
            "stand_in": sorted(self.cpu.stand_in.items()),
            "gpus": [[g.name, list(g.compute_capability), round(g.memory_bytes / 2**30)] for g in self.gpus],
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        """One line for people: "AMD EPYC, 2 cores, AVX512_CORE_BF16 (native bf16, ...); no GPU"."""
        cpu = f"{self.cpu.model}, {self.cpu.logical_cores} cores, {self.cpu.isa_summary}"
        if self.cpu.stand_in:
            cpu += f" [stand-in: {', '.join(f'{k}={v}' for k, v in sorted(self.cpu.stand_in.items()))}]"
        gpus = "; ".join(f"{g.name} (compute capability {g.capability_text})" for g in self.gpus)
        return cpu + "; " + (gpus or ("Apple MPS" if self.mps else "no GPU"))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (lists, not tuples: provenance records are stored and compared as JSON)."""
        data = json.loads(json.dumps(asdict(self)))
        data["fingerprint"] = self.fingerprint()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MachineProbe:
        cpu = dict(data["cpu"])
        cpu["flags"] = tuple(cpu.get("flags", ()))
        cpu.setdefault("stand_in", {})
        gpus = tuple(
            GpuProbe(
                index=int(g["index"]),
                name=str(g["name"]),
                compute_capability=tuple(g["compute_capability"]),
                memory_bytes=int(g.get("memory_bytes", 0)),
            )
            for g in data.get("gpus", ())
        )
        return cls(
            cpu=CpuProbe(**cpu),
            gpus=gpus,
            mps=bool(data.get("mps", False)),
            xla=dict(data.get("xla", {})),
            torch_version=str(data.get("torch_version", "")),
        )

    def with_cpu(self, **changes: Any) -> MachineProbe:
        return replace(self, cpu=replace(self.cpu, **changes))


# -- the decisions ------------------------------------------------------------------------------------------

BF16_TRAP_NOTE = (
    "oneDNN then has no bf16 kernels and falls back to a reference path: measured 60-300x slower than fp32 "
    "per convolution on AVX2 CPUs (AMD EPYC AVX2; AVX2 stand-in on an AMD EPYC Zen 5)"
)


def autocast_slower_reason(
    probe: MachineProbe, device_type: str, dtype: str, index: int | None = None
) -> str:
    """Why ``dtype`` autocast ("bf16"/"fp16") is expected to run slower than fp32 here, or "" if it is not.

    Settings that cannot apply at all (bf16 on a GPU older than 8.0) are not "slower": the optimization
    report says they do not apply.
    """
    if device_type == "cpu":
        cpu = probe.cpu
        if dtype == "bf16":
            if cpu.native_bf16:
                return ""
            if cpu.emulated_bf16:
                return (
                    f"this CPU ({cpu.model}, oneDNN {cpu.onednn_isa}) has AVX-512 but no AVX-512 BF16 or AMX: "
                    "oneDNN emulates bf16 by converting around every operation, which is slower than fp32"
                )
            return f"this CPU ({cpu.model}, oneDNN {cpu.onednn_isa}) has no native bf16; {BF16_TRAP_NOTE}"
        if dtype == "fp16":
            if cpu.native_fp16:
                return ""
            return (
                f"this CPU ({cpu.model}, oneDNN {cpu.onednn_isa}) has no native fp16 (AVX-512 FP16 or AMX-FP16): "
                "fp16 convolutions fall back to slow paths, slower than fp32"
            )
    if device_type == "cuda" and dtype == "fp16":
        gpu = probe.gpu(index)
        if gpu is not None and not gpu.fp16_tensor_cores:
            return (
                f"{gpu.name} (compute capability {gpu.capability_text}) has no fp16 tensor cores (7.0+): "
                "fp16 is expected to be no faster than fp32 there"
            )
    return ""


# -- probing this machine -----------------------------------------------------------------------------------


def _cpuinfo() -> tuple[str, str, set[str]]:
    vendor, model = platform.machine(), platform.processor() or platform.machine()
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id" and vendor == platform.machine():
                    vendor = value.strip()
                elif key == "model name" and model in (platform.processor(), platform.machine(), ""):
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
                if flags and key == "":
                    break
    except OSError:
        pass
    return vendor, model, flags


def _memory_bytes() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - the probe never raises
        return 0


def _probe_cpu() -> CpuProbe:
    import torch

    vendor, model, flags = _cpuinfo()
    stand_in = {k: os.environ[k] for k in STAND_IN_VARIABLES if os.environ.get(k)}
    hw = hardware_isa(flags)
    hw_rank = _ISA_NAMES.index(hw) if hw in _ISA_NAMES else -1
    onednn = _ISA_NAMES[min(hw_rank, _isa_rank(os.environ.get("ONEDNN_MAX_CPU_ISA")))] if hw_rank >= 0 else hw
    rank = _ISA_NAMES.index(onednn) if onednn in _ISA_NAMES else -1
    at = lambda name: rank >= _ISA_NAMES.index(name)  # noqa: E731 - a local predicate reads better here
    try:
        torch_says_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # noqa: BLE001 - an old or unusual build: go by the ISA alone
        torch_says_bf16 = at("AVX512_CORE")
    native_bf16 = torch_says_bf16 and at("AVX512_CORE_BF16") and bool({"avx512_bf16", "amx_bf16"} & flags)
    native_fp16 = at("AVX10_1_512") and bool({"avx512_fp16", "amx_fp16"} & flags)
    int8_dot = None
    if at("AVX10_1_512_AMX") and "amx_int8" in flags:
        int8_dot = "AMX-INT8"
    elif at("AVX512_CORE_VNNI") and "avx512_vnni" in flags:
        int8_dot = "AVX512-VNNI"
    elif "avx_vnni" in flags and at("AVX2_VNNI"):
        int8_dot = "AVX-VNNI"
    engines = torch.backends.quantized.supported_engines
    int8_engine = next((e for e in ("x86", "fbgemm", "onednn") if e in engines), None)
    try:
        threads = torch.get_num_threads()
    except Exception:  # noqa: BLE001
        threads = 0
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return CpuProbe(
        vendor=vendor,
        model=model,
        logical_cores=cores,
        torch_threads=threads,
        memory_bytes=_memory_bytes(),
        flags=tuple(f for f in RELEVANT_FLAGS if f in flags),
        hardware_isa=hw,
        onednn_isa=onednn,
        torch_capability=str(torch.backends.cpu.get_cpu_capability()),
        native_bf16=native_bf16,
        emulated_bf16=torch_says_bf16 and not native_bf16 and at("AVX512_CORE"),
        native_fp16=native_fp16,
        int8_dot=int8_dot,
        int8_engine=int8_engine,
        stand_in=stand_in,
    )


def _probe_gpus() -> tuple[GpuProbe, ...]:
    import torch

    try:
        if not torch.cuda.is_available():
            return ()
        gpus = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append(GpuProbe(index, props.name, (props.major, props.minor), int(props.total_memory)))
        return tuple(gpus)
    except Exception:  # noqa: BLE001 - a broken driver is "no GPU", not a crash
        return ()


def _probe_xla() -> dict[str, Any]:
    import importlib.util

    return {"jax_installed": importlib.util.find_spec("jax") is not None, "tpu_present": tpu_present()}


@functools.lru_cache(maxsize=1)
def _cached_probe(_environment: tuple) -> MachineProbe:
    import torch

    mps = getattr(torch.backends, "mps", None)
    return MachineProbe(
        cpu=_probe_cpu(),
        gpus=_probe_gpus(),
        mps=bool(mps is not None and mps.is_available()),
        xla=_probe_xla(),
        torch_version=torch.__version__,
    )


def probe_machine() -> MachineProbe:
    """This machine's probe (cached per process and per stand-in variables; never raises for missing GPUs)."""
    return _cached_probe(tuple(os.environ.get(k, "") for k in STAND_IN_VARIABLES))


GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips are PCI devices of Google's vendor id on every TPU VM generation


def tpu_present() -> bool:
    """True when TPU chips are attached: a PCI device of Google's vendor id. (/dev/accel* and /dev/vfio alone
    also exist on Intel NPU laptops and virtualisation hosts.)"""
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip().lower() == GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return False
