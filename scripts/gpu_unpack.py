"""On the GPU machine: join the payload's parts, check them, unpack, and zip each wheel folder back into its wheel.

    python3 scripts/gpu_unpack.py PARTS_DIR DEST

PARTS_DIR holds ``payload.tar.xz.partNN`` and ``payload.sha256`` (scripts/gpu_payload.py). DEST gets
``wheelhouse/*.whl`` (vLLM, its dependencies, uv), ``control/*.whl`` and ``control-requirements.txt``.
A wheel's RECORD lists the sha256 of each file inside, so zipping the same files again gives a wheel
pip and uv install exactly as the original. Nothing half-made is left under a final name.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def zip_folder(folder: Path) -> str:
    """The folder ``x.whl/`` becomes the file ``x.whl`` in the same place."""
    wheel, partial = folder, folder.with_name(folder.name + ".partial")

    def order(path: Path):
        # .dist-info last, RECORD at the very end, as wheel tools write them
        name = str(path.relative_to(folder))
        return (".dist-info/" in name, name.endswith(".dist-info/RECORD"), name)

    files = sorted((p for p in folder.rglob("*") if p.is_file()), key=order)
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for path in files:
            archive.write(path, str(path.relative_to(folder)))
    shutil.rmtree(folder)
    partial.rename(wheel)
    return wheel.name


def main() -> None:
    parts_dir, dest = Path(sys.argv[1]), Path(sys.argv[2])
    parts = sorted(parts_dir.glob("payload.tar.xz.part*"))
    want = (parts_dir / "payload.sha256").read_text().split()[0]
    digest = hashlib.sha256()
    for part in parts:
        with open(part, "rb") as handle:
            while chunk := handle.read(8 << 20):
                digest.update(chunk)
    if digest.hexdigest() != want:
        sys.exit(f"payload: sha256 {digest.hexdigest()} of {len(parts)} parts is not {want}: a part is missing or cut")
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    cat = subprocess.Popen(["cat", *map(str, parts)], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-xJf", "-", "-C", str(staging)], stdin=cat.stdout, check=True)
    cat.wait()
    folders = [p for group in ("wheelhouse", "control") for p in sorted((staging / group).glob("*.whl")) if p.is_dir()]
    with ProcessPoolExecutor() as pool:
        made = list(pool.map(zip_folder, folders))
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
    print(f"payload: {len(made)} wheels in {dest}")


if __name__ == "__main__":
    main()
