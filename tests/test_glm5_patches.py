"""The GLM-5 patch series (patches/glm-5/): well-formed, referenced by the catalog entry, and what
can be checked here without GPUs or the checkpoint.

Against the real vLLM 0.16.0 wheel the series is checked when HEAVYLIFT_VLLM_WHEELHOUSE names a
folder holding it (``pip download vllm==0.16.0 --no-deps -d DIR``, ~500 MB): it must apply in
order with --fuzz=0, as heavylift's plan-time check does.
"""

import ast
import os
import re
import textwrap
from pathlib import Path

import pytest

from models.catalog import load_entry
from resolve import vllm_build

REPO = Path(__file__).resolve().parent.parent
SERIES = sorted((REPO / "patches" / "glm-5").glob("*.patch"))


def test_catalog_entry_carries_the_series_in_order():
    entry = load_entry("glm-5")
    assert entry.vllm_patches == [str(p.relative_to(REPO)) for p in SERIES]
    assert len(SERIES) == 3


@pytest.mark.parametrize("patch", SERIES, ids=[p.name for p in SERIES])
def test_patch_is_a_p1_diff_of_vllm_files_with_its_reason(patch):
    text = patch.read_text()
    header = text.split("\n--- ", 1)[0]
    assert "Written against the vllm 0.16.0 wheel" in header and "Not checked:" in header
    assert vllm_build.patched_paths(text) and all(p.startswith("vllm/") for p in vllm_build.patched_paths(text))


def added_function(patch: Path, name: str) -> str:
    """The source of a function the patch adds (its '+' lines)."""
    added = [line[1:] for line in patch.read_text().splitlines() if line.startswith("+") and not line.startswith("+++")]
    source = "\n".join(added)
    start = source.index(f"def {name}(")
    end = source.find("\n\n\n", start)
    return textwrap.dedent(source[start:end if end > 0 else None])


def test_split_gguf_shards_found_in_order(tmp_path):
    source = added_function(SERIES[1], "gguf_split_files")
    ast.parse(source)
    namespace = {"re": re, "os": os}
    exec(source, namespace)
    split = namespace["gguf_split_files"]
    shards = [tmp_path / f"GLM-5-Q4_K_M-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    for shard in shards:
        shard.write_bytes(b"GGUF")
    assert split(str(shards[1])) == [str(s) for s in shards]
    single = tmp_path / "model.gguf"
    assert split(str(single)) == [str(single)]
    shards[2].unlink()
    with pytest.raises(FileNotFoundError, match="00003-of-00003"):
        split(str(shards[0]))


def test_series_applies_to_the_real_vllm_0_16_0_wheel():
    wheelhouse = os.environ.get("HEAVYLIFT_VLLM_WHEELHOUSE")
    if not wheelhouse or not list(Path(wheelhouse).glob("vllm-0.16.0-*.whl")):
        pytest.skip("set HEAVYLIFT_VLLM_WHEELHOUSE to a folder with the vllm 0.16.0 wheel")
    build = vllm_build.Build("vllm", "0.16.0", "release")
    assert vllm_build.check_patch_series(build, [str(p) for p in SERIES], wheelhouse) == "3 patches apply to vllm 0.16.0"
