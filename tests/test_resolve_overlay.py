"""resolve/overlay.py: the checkpoint overlay's configs, the pristine JSON with dotted keys removed and set."""

import copy

import pytest

from resolve.overlay import PatchError, apply_patch


PRISTINE = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "quantization_config": {"quant_method": "fp8", "ignore": ["lm_head"], "fmt": {"weights": "e4m3"}},
    "rope_scaling": None,
    "num_layers": 61,
}


@pytest.mark.parametrize(
    ("remove", "set_values", "expected"),
    [
        pytest.param([], {}, PRISTINE, id="empty_patch_is_identity"),
        pytest.param(
            ["quantization_config.ignore", "num_layers"], {},
            {"architectures": ["DeepseekV3ForCausalLM"], "rope_scaling": None,
             "quantization_config": {"quant_method": "fp8", "fmt": {"weights": "e4m3"}}},
            id="remove_nested_and_top_level_keeps_siblings",
        ),
        pytest.param(
            ["absent", "quantization_config.absent", "no.such.parent", "num_layers.child", "rope_scaling.factor",
             "architectures.0"],
            {}, PRISTINE, id="removing_absent_keys_or_through_non_dicts_is_not_an_error",
        ),
        pytest.param(
            [], {"quantization_config.fmt.weights": "e5m2", "max_model_len": 8192},
            {**PRISTINE, "max_model_len": 8192,
             "quantization_config": {**PRISTINE["quantization_config"], "fmt": {"weights": "e5m2"}}},
            id="set_existing_nested_and_new_top_level",
        ),
        pytest.param(
            [], {"a.b.c": 1, "quantization_config.new.deep": [1, 2]},
            {**PRISTINE, "a": {"b": {"c": 1}},
             "quantization_config": {**PRISTINE["quantization_config"], "new": {"deep": [1, 2]}}},
            id="set_creates_missing_parents",
        ),
        pytest.param(
            ["quantization_config"], {"quantization_config.quant_method": "bf16"},
            {**{k: v for k, v in PRISTINE.items() if k != "quantization_config"},
             "quantization_config": {"quant_method": "bf16"}},
            id="removes_apply_before_sets",
        ),
        pytest.param(
            [], {"quantization_config": {"quant_method": "none"}},
            {**PRISTINE, "quantization_config": {"quant_method": "none"}},
            id="set_dict_value_replaces_whole",
        ),
    ],
)
def test_apply_patch(remove, set_values, expected):

    before = copy.deepcopy(PRISTINE)
    patched = apply_patch(PRISTINE, remove, set_values)
    assert patched == expected
    assert PRISTINE == before, "apply_patch must not modify its input"


@pytest.mark.parametrize(
    "dotted", ["num_layers.child", "architectures.x", "rope_scaling.factor", "quantization_config.ignore.x.y"]
)
def test_apply_patch_set_through_non_dict_parent_fails(dotted):
    with pytest.raises(PatchError, match=rf"^cannot set {dotted.replace('.', '[.]')}: a parent key is not a mapping$"):
        apply_patch(PRISTINE, [], {dotted: 1})


def test_apply_patch_result_shares_nothing_with_input():
    patched = apply_patch(PRISTINE, [], {})
    patched["quantization_config"]["ignore"].append("x")
    assert PRISTINE["quantization_config"]["ignore"] == ["lm_head"]
