"""Build the payload that lets heavylift converge a GPU machine with no registry: wheels, uv, heavylift's
own control-side dependencies, packed small enough to carry in a few 60 MB parts.

    scripts/bootstrap.sh                                  # once: heavylift's uv (.tools/bin/uv) and .venv
    .venv/bin/python scripts/gpu_payload.py [OUT_DIR] [--vllm 0.26.0] [--python 3.12] [--part-mb 55]

OUT_DIR defaults to the repository's ``.gpu/`` (ignored by git), where ``scripts/gpu_proof.sh carry`` reads
the parts on the GPU machine. uv is heavylift's own, ``.tools/bin/uv`` (``HEAVYLIFT_UV`` names another),
never ``uv`` from PATH, as everywhere in heavylift (scripts/bootstrap.sh says why).

What it makes (in OUT_DIR):
- ``payload.tar.xz.partNN`` and ``payload.sha256``: one xz archive, split into parts of at most 55 MiB,
  so that one part and the working tree (a few MB) fit the 64 MiB one GPU-machine call carries. It holds every wheel
  *unpacked* (xz compresses the files far better than the wheels' own deflate); on the GPU machine
  ``scripts/gpu_unpack.py`` zips each folder back into the same wheel (the RECORD inside a wheel
  lists its files' hashes, not the zip's, so the re-zipped wheel is the same wheel to pip and uv).
- ``build/``: what the parts are made of (kept, so a second run downloads nothing again):
- ``build/wheelhouse/``: the vLLM build and everything it needs except what the host's Python already has
  (``HOST_PACKAGES``: torch and its companions, reused through ``vllm.host_packages``) and the
  optional GPU kernel packages a dense or MLA model does not import (``EXCLUDED``); plus uv's wheel.
- ``build/control/``: heavylift's own dependencies (uv.lock) for the GPU machine's Python, to run pyinfra there.

The vLLM wheel is pruned of parts Hopper never loads (``PRUNED``): FlashAttention 2's kernels
(Hopper runs FA3), the Rust router binary and the SM100 FMHA's sources. The pruned wheel
gets a build tag (``1heavyliftpruned``): same version, visibly not PyPI's file.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# heavylift's own uv, installed by scripts/bootstrap.sh; a uv from PATH may be another version or a pyenv shim
UV = Path(os.environ.get("HEAVYLIFT_UV") or REPO / ".tools" / "bin" / "uv")
UV_VERSION = "0.13.9"
HUB_CLIENT = "huggingface_hub==2.4.0"
# reused from the host's own Python (the GPU image's CUDA build of torch): vllm.host_packages
HOST_PACKAGES = ["torch", "torchvision", "torchaudio", "triton"]
# vLLM 0.26.0 requirements that serving a dense or MLA text model does not import; kept out of the
# wheelhouse and out of the install (vllm.exclude_packages). Measured: docs/gpu-proof.md (vLLM
# 0.26.0 served a dense Llama on an H200 without them). opencv/numba/llvmlite: image and n-gram
# speculative decoding paths only (the GPU image has its own copies on the host path).
EXCLUDED = [
    "torchcodec", "pynvvideocodec", "flashinfer-python", "tilelang", "nvidia-cudnn-frontend", "fastsafetensors",
    "nvidia-cutlass-dsl", "quack-kernels", "tokenspeed-mla", "humming-kernels",
    "opencv-python-headless", "numba", "llvmlite",
]
# DeepGEMM (vllm/third_party/deep_gemm, 34 MB, mostly headers its JIT compiles with the host's nvcc) stays: the
# DeepSeek sparse attention indexer of GLM-5 / DeepSeek-V3.2 (glm_moe_dsa, deepseek_v32) needs it on CUDA
# (vLLM 0.26.0 vllm/model_executor/layers/sparse_attn_indexer.py: "Sparse Attention Indexer CUDA op requires
# DeepGEMM support in the current vLLM environment")
PRUNED = (
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    "vllm/vllm-rs",
    "vllm/third_party/fmha_sm100/",
)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(args), flush=True)
    return subprocess.run(args, check=True, **kwargs)


def uv() -> str:
    """heavylift's uv, or an error that says how to get it."""
    if not os.access(UV, os.X_OK):
        sys.exit(f"gpu_payload: no uv at {UV}: run scripts/bootstrap.sh first (it installs heavylift's uv "
                 "into .tools/bin/uv), or set HEAVYLIFT_UV to a uv binary")
    return str(UV)


def pip() -> list[str]:
    """pip, run by uv (heavylift's control venv has no pip of its own)."""
    return [uv(), "tool", "run", "--quiet", "--from", "pip==25.3", "pip"]


def download(requirements: list[str], dest: Path, python: str) -> None:
    """Binary wheels for the GPU machine's Python and CPU, exactly these versions, no dependencies."""
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    run(*pip(), "download", "--quiet", "--disable-pip-version-check", "--no-deps",
        "--only-binary=:all:", "--python-version", python, "--implementation", "cp", *platforms, "-d", str(dest), *requirements)


def closure(vllm: str, python: str, find_links: Path) -> list[str]:
    """vLLM's dependency closure for that Python on x86_64 Linux, without the host's and the excluded packages."""
    excludes = find_links / "excludes.txt"
    excludes.write_text("\n".join(HOST_PACKAGES + EXCLUDED) + "\n")
    out = run(uv(), "pip", "compile", "--quiet", "--python-version", python, "--python-platform", "x86_64-manylinux_2_28",
              "--excludes", str(excludes), "--find-links", str(find_links), "--no-header", "--no-annotate", "-",
              input=f"vllm=={vllm}\n{HUB_CLIENT}\n", capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip() and not line.startswith(("#", " "))]


def record_row(name: str, data: bytes) -> list:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", len(data)]


def prune_wheel(wheel: Path, dest_dir: Path) -> Path:
    """The wheel without ``PRUNED``, its RECORD rewritten, under a build tag that says so."""
    name, version, *rest = wheel.name[:-4].split("-")
    pruned = dest_dir / f"{name}-{version}-1heavyliftpruned-{'-'.join(rest[-3:])}.whl"
    if pruned.exists():
        return pruned
    removed = 0
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(pruned.with_suffix(".partial"), "w", zipfile.ZIP_DEFLATED) as out:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        # RECORD is CSV: some of vLLM's file names hold commas and must be quoted (uv refuses the wheel otherwise)
        record = io.StringIO()
        writer = csv.writer(record, lineterminator="\n")
        for info in src.infolist():
            if info.filename.startswith(PRUNED) or info.filename == record_name:
                removed += info.file_size if info.filename != record_name else 0
                continue
            data = src.read(info)
            out.writestr(info, data)
            writer.writerow(record_row(info.filename, data))
        writer.writerow([record_name, "", ""])
        out.writestr(record_name, record.getvalue())
    pruned.with_suffix(".partial").rename(pruned)
    print(f"pruned {wheel.name}: {removed / 1e6:.0f} MB of files left out -> {pruned.name}", flush=True)
    return pruned


def unpack(wheel: Path, into: Path) -> None:
    """A wheel's files under a folder named after the wheel (gpu_unpack.py zips it back)."""
    folder = into / wheel.name
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(folder)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", default=REPO / ".gpu")
    parser.add_argument("--vllm", default="0.26.0")
    parser.add_argument("--python", default="3.12")
    parser.add_argument("--part-mb", type=int, default=55)
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    # as bootstrap.sh runs uv: never a downloaded Python, the system's certificate store
    os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
    os.environ.setdefault("UV_SYSTEM_CERTS", "1")
    build = out / "build"
    raw, wheelhouse, control = build / "raw", build / "wheelhouse", build / "control"
    for folder in (raw, wheelhouse, control):
        folder.mkdir(parents=True, exist_ok=True)

    download([f"vllm=={args.vllm}"], raw, args.python)
    vllm_wheel = next(raw.glob(f"vllm-{args.vllm}-*.whl"))
    requirements = [r for r in closure(args.vllm, args.python, raw) if not r.startswith("vllm==")]
    download(requirements, wheelhouse, args.python)
    wanted = {r.split("==")[0].replace("_", "-").lower() for r in requirements}
    for stale in wheelhouse.glob("*.whl"):
        if stale.name.split("-")[0].replace("_", "-").lower() not in wanted:
            stale.unlink()  # from an earlier build (a package now excluded, an older vLLM)
    prune_wheel(vllm_wheel, wheelhouse)
    run(*pip(), "download", "--quiet", "--disable-pip-version-check", "--no-deps",
        "--only-binary=:all:", "--platform", "manylinux_2_17_x86_64", "-d", str(wheelhouse), f"uv=={UV_VERSION}")
    locked = subprocess.run([uv(), "export", "--frozen", "--no-dev", "--no-hashes", "--no-emit-project"],
                            cwd=REPO, check=True, capture_output=True, text=True).stdout
    control_requirements = [line.split(";")[0].strip() for line in locked.splitlines() if line and not line.lstrip().startswith("#")]
    download(control_requirements, control, args.python)
    (build / "control-requirements.txt").write_text("\n".join(control_requirements) + "\n")

    tree = build / "tree"
    if not tree.exists():
        staging = build / "tree.partial"
        for group, folder in (("wheelhouse", wheelhouse), ("control", control)):
            for wheel in sorted(folder.glob("*.whl")):
                unpack(wheel, staging / group)
        (staging / "control-requirements.txt").write_text((build / "control-requirements.txt").read_text())
        staging.rename(tree)
    archive = build / "payload.tar.xz"
    if not archive.exists():
        with open(archive.with_suffix(".partial"), "wb") as handle:
            tar = subprocess.Popen(["tar", "-C", str(tree), "-cf", "-", "."], stdout=subprocess.PIPE)
            subprocess.run(["xz", "-9", "-T0"], stdin=tar.stdout, stdout=handle, check=True)
            if tar.wait() != 0:
                raise SystemExit("tar failed")
        archive.with_suffix(".partial").rename(archive)
    for old in out.glob("payload.tar.xz.part*"):
        old.unlink()
    run("split", "-b", f"{args.part_mb}M", "-d", "-a", "2", str(archive), str(out / "payload.tar.xz.part"))
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    (out / "payload.sha256").write_text(f"{digest}  payload.tar.xz\n")
    parts = sorted(out.glob("payload.tar.xz.part*"))
    print(f"payload: {archive.stat().st_size / 1e6:.1f} MB in {len(parts)} parts of at most {args.part_mb} MiB in {out}: "
          f"{', '.join(p.name for p in parts)}; carry one part (and payload.sha256) per GPU-machine call")


if __name__ == "__main__":
    main()
