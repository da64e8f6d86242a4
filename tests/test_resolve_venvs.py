"""resolve/venvs.py: which old vLLM venvs a run removes (the commands: tests/operations/runtime.venvs_pruned/)."""

from resolve.venvs import venvs_to_remove

VENVS = "/opt/heavylift/venvs"


def found(linked=(), **venvs):
    """VenvFolders: name -> (complete, mtime)."""
    return {"venvs": {name.replace("_", "-"): {"complete": complete, "mtime": mtime}
                      for name, (complete, mtime) in venvs.items()}, "linked": list(linked)}


def test_the_protected_then_the_newest_stay_a_linked_one_on_top_and_a_half_made_one_goes():
    state = found(["vllm-1"], vllm_1=(True, 100), vllm_2=(True, 200), vllm_3=(True, 300), vllm_4=(True, 400),
                  vllm_5=(False, 500), hub_client=(True, 50))
    assert venvs_to_remove(state, ["vllm-"], 2, [f"{VENVS}/vllm-2/"]) == (3, ["vllm-3", "vllm-5"])
    # a half-made one goes whatever the count; the count of those that stay takes the linked one too
    assert venvs_to_remove(state, ["vllm-"], 4, []) == (4, ["vllm-5"])
    assert venvs_to_remove(found(), ["vllm-"], 3, []) == (0, [])
