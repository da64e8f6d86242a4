"""models/schema.py: the site settings' own checks, each refusal naming the field and what to do."""

import pytest
from pydantic import ValidationError

from models.schema import SiteSettings


def settings(**data):
    return SiteSettings.model_validate({"model": "tiny-llama", "vllm": {"version": "0.34.0"}, **data})


@pytest.mark.parametrize("field", ["hf_token", "api_key"])
def test_a_plain_secret_in_the_inventory_is_refused_without_repeating_it(field):
    with pytest.raises(ValidationError) as raised:
        settings(**{field: "hf_AbCdEfGhIjKlMnOp"})
    assert "never goes into the inventory" in str(raised.value)


def test_api_key_flag_is_refused_in_extra_args():
    with pytest.raises(ValidationError, match="api_key"):
        settings(extra_args=["--api-key", "sk-x"])


def test_service_user_is_not_root():
    with pytest.raises(ValidationError, match="other than root"):
        settings(service_user="root")


@pytest.mark.parametrize("gpus, message", [([], "empty list"), ([0, 0], "names a GPU twice"), ([-1], "0 or more")])
def test_bad_gpu_lists(gpus, message):
    with pytest.raises(ValidationError, match=message):
        settings(gpus=gpus)
