"""resolve/plancache.py: a kept plan-time answer is the answer the index or Hub gave, and any changed
input asks again. The vLLM index is the local stand-in (testbed/wheel_index.py, real HTTP on loopback)."""

from __future__ import annotations

import json

import pytest

from models.schema import VllmRuntime
from resolve import hub, plancache, vllm_build
from testbed.wheel_index import WheelIndex

COMMIT = "c" * 40


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEAVYLIFT_CACHE", str(tmp_path / "cache"))
    vllm_build._project_page.cache_clear()
    hub._listed.cache_clear()
    yield tmp_path / "cache" / "plan"


@pytest.fixture
def index(tmp_path, monkeypatch):
    idx = WheelIndex(tmp_path / "wheels")
    idx.add_pypi("torch", "2.9.1")
    idx.add_pypi("vllm", "0.16.0", requires=("torch==2.9.1",))
    idx.add_commit(COMMIT, "0.17.0rc1.dev5+gccccccccc", requires=("torch==2.9.1",))
    idx.start()
    monkeypatch.setattr(vllm_build, "PYPI_SIMPLE", f"{idx.url}/pypi/")
    yield idx
    idx.stop()


def test_kept_answers_skip_the_call_and_keep_key_order(cache):
    calls = []

    def answer():
        calls.append(1)
        return {"z": 1, "a": {"y": 2, "b": 3}}

    first = plancache.kept("hub-file", {"repo": "o/r", "commit": COMMIT}, answer)
    second = plancache.kept("hub-file", {"repo": "o/r", "commit": COMMIT}, answer)
    assert len(calls) == 1
    # a config re-rendered from the kept answer is the same bytes (json.dumps keeps dict order)
    assert json.dumps(second) == json.dumps(first)
    plancache.kept("hub-file", {"repo": "o/r", "commit": "d" * 40}, answer)
    plancache.kept("hub-file", {"repo": "o/r", "commit": COMMIT}, answer, refresh=True)
    assert len(calls) == 3


def test_a_failed_answer_is_not_kept(cache):
    def refused():
        raise OSError("unreachable")

    with pytest.raises(OSError):
        plancache.kept("hub-tree", {"repo": "o/r"}, refused)
    assert not cache.exists() or not list(cache.iterdir())


def test_a_release_is_asked_of_the_index_once(index):
    runtime = VllmRuntime(version="0.16.0")
    fresh = vllm_build.resolve(runtime)
    url = index.url
    index.stop()
    vllm_build._project_page.cache_clear()
    kept = vllm_build.resolve(runtime)
    assert kept == fresh and kept.wheels == fresh.wheels and kept.wheels
    # a changed version is another question: asked, and the stopped index cannot answer it
    with pytest.raises(vllm_build.BuildNotFound, match="cannot read the index"):
        vllm_build.resolve(VllmRuntime(version="0.16.1"))
    # another index for the same version too
    with pytest.raises(vllm_build.BuildNotFound):
        vllm_build.resolve(VllmRuntime(version="0.16.0", index_url=f"{url}/other/"))
    # refresh_lock asks again
    with pytest.raises(vllm_build.BuildNotFound):
        vllm_build.resolve(runtime, refresh=True)


def test_a_missing_build_is_asked_again(index):
    with pytest.raises(vllm_build.BuildNotFound, match="0.16.5"):
        vllm_build.resolve(VllmRuntime(version="0.16.5"))
    index.add_pypi("vllm", "0.16.5", requires=("torch==2.9.1",))
    vllm_build._project_page.cache_clear()
    assert vllm_build.resolve(VllmRuntime(version="0.16.5")).version == "0.16.5"


def test_a_commits_build_is_kept(index):
    runtime = VllmRuntime(nightly=COMMIT, wheel_index=index.url)
    fresh = vllm_build.resolve(runtime)
    index.stop()
    vllm_build._project_page.cache_clear()
    assert vllm_build.resolve(runtime) == fresh and fresh.commit == COMMIT


def test_the_hub_listing_of_a_commit_is_kept_and_filtered_each_run(monkeypatch):
    import huggingface_hub
    from huggingface_hub.hf_api import RepoFile

    asked = []

    def tree(self, repo, revision=None, recursive=False):
        asked.append((self.endpoint, repo, revision))
        return [RepoFile(path="config.json", size=10, oid="1"),
                RepoFile(path="model.safetensors", size=99, oid="2", lfs={"size": 99, "oid": "e" * 64, "pointerSize": 1})]

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_tree", tree)
    mirror = hub.HubClient("http://mirror")
    first = hub.snapshot(mirror, "o/r", COMMIT, ("*.json", "*.safetensors"))
    hub._listed.cache_clear()
    again = hub.snapshot(mirror, "o/r", COMMIT, ("*.json", "*.safetensors"))
    assert again == first and len(asked) == 1 and first.files[1].sha256 == "e" * 64
    # patterns from a changed catalog entry apply to the kept listing
    assert [f.path for f in hub.snapshot(mirror, "o/r", COMMIT, ("*.json",)).files] == ["config.json"]
    # another endpoint or commit is another question, and so is refresh_lock
    hub.snapshot(hub.HubClient("http://other-mirror"), "o/r", COMMIT, ("*.json",))
    hub.snapshot(mirror, "o/r", "d" * 40, ("*.json",))
    hub._listed.cache_clear()
    hub.snapshot(hub.HubClient("http://mirror", refresh=True), "o/r", COMMIT, ("*.json",))
    # a branch name is never kept
    hub.snapshot(mirror, "o/r", "main", ("*.json",))
    hub._listed.cache_clear()
    hub.snapshot(mirror, "o/r", "main", ("*.json",))
    assert len(asked) == 6


def test_a_config_file_of_a_commit_is_kept_in_its_key_order(monkeypatch, tmp_path):
    import huggingface_hub

    asked = []
    path = tmp_path / "config.json"
    path.write_text('{"vocab_size": 1, "architectures": ["X"], "quantization_config": {"z": 1, "a": 2}}')

    def download(repo, filename, revision=None, endpoint=None, token=None):
        asked.append(filename)
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    hub._json_file.cache_clear()
    mirror = hub.HubClient("http://mirror")
    fresh = mirror.json_file("o/r", COMMIT, "config.json")
    hub._json_file.cache_clear()
    kept = mirror.json_file("o/r", COMMIT, "config.json")
    assert len(asked) == 1
    # the overlay renders from it: the same bytes, or a re-run would restart vLLM
    assert json.dumps(kept, indent=2) == json.dumps(fresh, indent=2)
