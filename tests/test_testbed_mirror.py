"""The test bed itself: tiny checkpoints are well-formed and the olah Hub mirror serves them byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import HfApi, snapshot_download
from safetensors import safe_open
from tokenizers import Tokenizer

from testbed.hub_mirror import READINESS_PATH, HubMirror, answers_http, free_port, publish_repo, repo_dir
from testbed.tiny_model import write_tiny_llama, write_tiny_mla

REPO_ROOT = Path(__file__).resolve().parent.parent


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def shard_tensors(folder: Path) -> dict[str, tuple[str, str, list[int]]]:
    """{tensor name: (shard file, dtype, shape)} read from the safetensors headers."""
    found = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(shard, framework="np") as f:
            for name in f.keys():
                tensor = f.get_slice(name)
                found[name] = (shard.name, tensor.get_dtype(), tensor.get_shape())
    return found


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".cache" not in p.relative_to(folder).parts
    }


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def mla(tmp_path_factory) -> Path:
    return write_tiny_mla(tmp_path_factory.mktemp("mla"))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with HubMirror(tmp_path_factory.mktemp("hub")) as mirror:
        yield mirror


# ---------------------------------------------------------------- tiny models


@pytest.mark.parametrize("model", ["llama", "mla"])
def test_index_covers_exactly_the_tensors_in_the_shards(model, request):
    folder = request.getfixturevalue(model)
    index = read_json(folder / "model.safetensors.index.json")
    tensors = shard_tensors(folder)
    assert {name: shard for name, (shard, _, _) in tensors.items()} == index["weight_map"]
    assert len(set(index["weight_map"].values())) == 2
    data_bytes = sum((f.stat().st_size for f in folder.glob("*.safetensors")))
    assert 0 < index["metadata"]["total_size"] < data_bytes


def test_llama_shapes_and_dtype_match_its_config(llama):
    config = read_json(llama / "config.json")
    tensors = shard_tensors(llama)
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_attention_heads"] * config["head_dim"] == 64
    assert tensors["model.embed_tokens.weight"][2] == [config["vocab_size"], config["hidden_size"]]
    assert tensors["lm_head.weight"][2] == [config["vocab_size"], config["hidden_size"]]
    assert f"model.layers.{config['num_hidden_layers'] - 1}.mlp.down_proj.weight" in tensors
    assert {dtype for _, dtype, _ in tensors.values()} == {"BF16"}


def test_tokenizer_round_trips_and_fits_the_vocab(llama):
    config = read_json(llama / "config.json")
    tokenizer = Tokenizer.from_file(str(llama / "tokenizer.json"))
    text = "Hello, world! Ünïcode 漢字"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    assert tokenizer.get_vocab_size() <= config["vocab_size"]
    tokenizer_config = read_json(llama / "tokenizer_config.json")
    assert tokenizer.token_to_id(tokenizer_config["eos_token"]) == config["eos_token_id"]
    assert "add_generation_prompt" in tokenizer_config["chat_template"]
    assert read_json(llama / "generation_config.json")["eos_token_id"] == config["eos_token_id"]


def test_mla_asks_for_an_fp8_kv_cache_in_both_config_files(mla):
    config = read_json(mla / "config.json")
    assert config["kv_lora_rank"] + config["qk_rope_head_dim"] == 576  # the only latent size CPU_MLA takes
    assert config["quantization_config"]["kv_cache_scheme"] == {"dynamic": False, "num_bits": 8, "type": "float"}
    assert read_json(mla / "hf_quant_config.json")["quantization"]["kv_cache_quant_algo"] == "FP8"
    tensors = shard_tensors(mla)
    assert tensors["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"][2] == [576, config["hidden_size"]]
    assert tensors["model.layers.1.mlp.gate.e_score_correction_bias"][1] == "F32"


def test_mla_without_kv_cache_quant_differs_only_by_the_two_entries(mla, tmp_path):
    clean = write_tiny_mla(tmp_path, kv_cache_quant=False)
    config, clean_config = read_json(mla / "config.json"), read_json(clean / "config.json")
    del config["quantization_config"]["kv_cache_scheme"]
    assert config == clean_config
    quant, clean_quant = read_json(mla / "hf_quant_config.json"), read_json(clean / "hf_quant_config.json")
    del quant["quantization"]["kv_cache_quant_algo"]
    assert quant == clean_quant
    different = {name for name, data in folder_bytes(mla).items() if folder_bytes(clean)[name] != data}
    assert different == {"config.json", "hf_quant_config.json"}


def test_writing_twice_gives_identical_bytes(llama, tmp_path):
    assert folder_bytes(write_tiny_llama(tmp_path)) == folder_bytes(llama)


def test_cli_writes_a_model(llama, tmp_path):
    # a subprocess, so the CLI's own imports and argument handling are what runs
    dest = tmp_path / "cli"
    subprocess.run([sys.executable, "-m", "testbed.tiny_model", "llama", str(dest)], cwd=REPO_ROOT, check=True)
    assert folder_bytes(dest) == folder_bytes(llama)


# ---------------------------------------------------------------- publish + mirror


def test_republishing_identical_content_keeps_the_sha(llama, tmp_path):
    first = publish_repo(tmp_path / "a", "tiny/llama", llama)
    assert publish_repo(tmp_path / "a", "tiny/llama", llama) == first
    # a fresh mirror gets the very same commit: fixed author, dates and message
    assert publish_repo(tmp_path / "b", "tiny/llama", llama) == first


def test_changed_content_adds_a_commit(llama, tmp_path):
    src = tmp_path / "src"
    subprocess.run(["cp", "-r", str(llama), str(src)], check=True)
    first = publish_repo(tmp_path / "hub", "tiny/llama", src)
    (src / "README.md").write_text("changed\n")
    (src / "special_tokens_map.json").unlink()
    second = publish_repo(tmp_path / "hub", "tiny/llama", src)
    repo = repo_dir(tmp_path / "hub", "tiny/llama")
    log = subprocess.run(["git", "-C", str(repo), "log", "--format=%H"], capture_output=True, text=True, check=True)
    assert log.stdout.split() == [second, first]
    files = subprocess.run(["git", "-C", str(repo), "ls-files"], capture_output=True, text=True, check=True)
    assert "special_tokens_map.json" not in files.stdout.split()


def test_snapshot_download_round_trip_is_byte_identical(hub, llama, tmp_path):
    sha = publish_repo(hub.mirror_dir, "tiny/llama-roundtrip", llama)
    api = HfApi(endpoint=hub.url)
    assert api.model_info("tiny/llama-roundtrip", revision="main").sha == sha
    tree = {f.path: f.size for f in api.list_repo_tree("tiny/llama-roundtrip", revision=sha, recursive=True)}
    assert tree == {name: len(data) for name, data in folder_bytes(llama).items()}
    local = tmp_path / "download"
    snapshot_download("tiny/llama-roundtrip", revision=sha, local_dir=local, endpoint=hub.url)
    assert folder_bytes(local) == folder_bytes(llama)


def test_mirror_serves_old_revisions_after_a_new_publish(hub, llama, mla, tmp_path):
    old = publish_repo(hub.mirror_dir, "tiny/moving", llama)
    new = publish_repo(hub.mirror_dir, "tiny/moving", mla)
    api = HfApi(endpoint=hub.url)
    assert api.model_info("tiny/moving", revision="main").sha == new
    snapshot_download("tiny/moving", revision=old, local_dir=tmp_path / "old", endpoint=hub.url)
    assert folder_bytes(tmp_path / "old") == folder_bytes(llama)


def test_serve_cli_runs_olah_in_the_foreground(llama, tmp_path):
    sha = publish_repo(tmp_path / "hub", "tiny/llama", llama)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "testbed.hub_mirror", "serve", "--dir", str(tmp_path / "hub"), "--port", str(port)],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not answers_http(url + READINESS_PATH):
            assert server.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        assert HfApi(endpoint=url).model_info("tiny/llama", revision="main").sha == sha
    finally:
        server.terminate()
        server.wait(10)
