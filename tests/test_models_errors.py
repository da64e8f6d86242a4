"""models/errors.py: heavylift's configuration error and the wording of its messages, as an operator reads them: the
file, the field, what is wrong, what to do, and never a secret. Whole messages with the file and host in front, as
a run prints them: tests/test_bad_inputs.py; the fixes the schema gives: tests/test_catalog.py, tests/test_validate.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from pyinfra.api.exceptions import DeployError

from models.errors import (
    HIDDEN,
    HeavyliftConfigError,
    closest,
    combine,
    describe_value,
    display_path,
    explain_error,
    hint_for,
    loc_path,
    model_at,
    redacted,
    short_repr,
)
from models.schema import CatalogEntry, MultiNode, ServeDefaults, SiteSettings, SiteSource, VllmRuntime

VLLM = {"version": "0.34.0"}
SECRET = "hf_s3cr3tVALUE"


def errors_of(model, data: dict) -> list[dict]:
    """pydantic's errors for ``data``, as validate.py and catalog.py get them."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    return caught.value.errors()


def site_message(data: dict, hints: dict | None = None) -> str:
    """The one problem a site's ``data`` has, worded (no file prefix: the callers add it)."""
    (error,) = errors_of(SiteSettings, {"model": "tiny-llama", "vllm": VLLM, **data})
    return explain_error(error, SiteSettings, hints or {})


# ---------------------------------------------------------------- the error and its problems


def test_the_error_is_pyinfras_deploy_error_and_shows_no_heavylift_frame():
    """pyinfra's CLI prints a DeployError as '--> pyinfra error: <message>' and names the innermost frame of
    ``__traceback__``: heavylift's own code, not the user's file. That attribute reads None; the interpreter keeps
    the real traceback for pytest and logging."""
    try:
        raise HeavyliftConfigError("site.py, host 'gpu1': field 'port' ...")
    except HeavyliftConfigError as error:
        assert isinstance(error, DeployError)
        assert error.__traceback__ is None
        assert sys.exc_info()[2] is not None
        assert str(error) == error.message == "site.py, host 'gpu1': field 'port' ..."
        assert error.problems == [error.message]


def test_one_problem_is_the_message_itself():
    error = combine(["site.py, host 'gpu1': field 'port': ... Fix: set port to 8000."])
    assert str(error) == "site.py, host 'gpu1': field 'port': ... Fix: set port to 8000."
    assert error.problems == [str(error)]


def test_several_problems_are_counted_listed_once_each_in_order_and_say_no_host_changed():
    error = combine(["b.py: field 'port'", "a.py: field 'root'", "b.py: field 'port'"])
    assert str(error) == (
        "2 problems in the inventory and model catalog; no host was changed:\n"
        "  - b.py: field 'port'\n"
        "  - a.py: field 'root'")
    assert error.problems == ["b.py: field 'port'", "a.py: field 'root'"]
    assert str(combine(["x", "y"], what="models/entry.yaml")).startswith("2 problems in models/entry.yaml; no host")


# ---------------------------------------------------------------- files, values


def test_a_file_is_named_as_the_operator_would_type_it(tmp_path):
    assert display_path(tmp_path / "inventory" / "site.py", tmp_path) == "inventory/site.py"
    assert display_path("group_data/all.py", tmp_path) == "group_data/all.py"
    assert display_path(tmp_path / "inventory" / ".." / "site.py", tmp_path) == "site.py"
    assert display_path("/etc/heavylift/site.py", tmp_path) == "/etc/heavylift/site.py"  # outside: absolute
    assert display_path("../site.py", tmp_path / "run") == str(tmp_path / "site.py")


def test_a_value_is_shown_short_with_its_kind():
    assert describe_value(0) == "0, an int"
    assert describe_value("8000") == "'8000', a string"
    assert describe_value(True) == "True, a boolean"
    assert describe_value([1]) == "[1], a list" and describe_value({}) == "{}, a dict"
    assert describe_value(None) == "None"
    long = short_repr("x" * 200)
    assert len(long) == 80 and long.endswith("...") and long.startswith("'xxx")
    assert short_repr("x" * 200, limit=10) == "'xxxxxx..."
    assert short_repr("main") == "'main'"


# ---------------------------------------------------------------- secrets


@pytest.mark.parametrize("name, value, shown", [
    ("hf_token", SECRET, HIDDEN),
    ("api_key", "sk-123", HIDDEN),
    ("env.HF_TOKEN", SECRET, HIDDEN),
    ("env.DB_PASSWORD", 1, HIDDEN),
    ("port", 8000, 8000),
    ("env.VLLM_LOGGING_LEVEL", "DEBUG", "DEBUG"),
    ("env", {"HF_TOKEN": SECRET, "VLLM_LOGGING_LEVEL": "DEBUG", "db_password": "p", "MY_SECRET": "s"},
     {"HF_TOKEN": HIDDEN, "VLLM_LOGGING_LEVEL": "DEBUG", "db_password": HIDDEN, "MY_SECRET": HIDDEN}),
    ("extra_args", ["--api-key", "sk-123", "--port", "8000"], ["--api-key", HIDDEN, "--port", "8000"]),
    ("extra_args", ["--hf-token=" + SECRET, "--enforce-eager"], ["--hf-token=" + HIDDEN, "--enforce-eager"]),
    ("extra_args", ["--api-key", "--enforce-eager"], ["--api-key", "--enforce-eager"]),  # no value: the next flag shows
    ("extra_args", ("--api-key", "-sk-dash"), ("--api-key", HIDDEN)),  # a tuple stays a tuple
    ("serve.extra_args", ["--max-model-len", "4096"], ["--max-model-len", "4096"]),
    # a secret's name hides whatever it holds (a list, a dict: a wrong type is still the secret)
    ("env.HF_TOKEN", [SECRET], HIDDEN),
    ("env.HF_TOKEN", {"value": SECRET}, HIDDEN),
    ("api_key", [SECRET], HIDDEN),
    ("env", {"HF_TOKEN": [SECRET]}, {"HF_TOKEN": HIDDEN}),
    # an argument and its value written as one item
    ("extra_args", ["--api-key " + SECRET, "--port=1"], ["--api-key " + HIDDEN, "--port=1"]),
    # a count of tokens, or the tokenizer, is no secret: its value is what the message is about
    ("benchmark_tokens", 5000000, 5000000),
    ("extra_args", ["--max-num-batched-tokens", "8192", "--tokenizer", "org/tok"],
     ["--max-num-batched-tokens", "8192", "--tokenizer", "org/tok"]),
    ("env", {"HF_TOKEN_PATH": "/p", "MAX_TOKENS": "9"}, {"HF_TOKEN_PATH": HIDDEN, "MAX_TOKENS": "9"}),
], ids=lambda value: str(value)[:30])
def test_a_secret_is_never_shown(name, value, shown):
    assert redacted(name, value) == shown
    assert SECRET not in repr(redacted(name, value))


@pytest.mark.parametrize("data", [
    {"hf_token": SECRET},
    {"env": {"HF_TOKEN": [SECRET]}},
    {"env": {"HF_TOKEN": {"value": SECRET}}},
    {"env": {"HF_TOKEN": 12345}},
    {"extra_args": ["--api-key " + SECRET, "--port=1"]},
    {"extra_args": ["--api-key", SECRET, "--port", "1"]},
    {"extra_args": ["--api-key", 12345]},
], ids=["plain-token", "env-list", "env-dict", "env-int", "arg-one-item", "arg-pair", "arg-value-item"])
def test_a_message_about_a_secret_names_the_field_and_never_repeats_it(data):
    message = site_message(data)
    assert SECRET not in message and "12345" not in message, message
    assert "field '" in message and "Fix: " in message


def test_a_plain_token_is_refused_with_where_to_read_it_from_and_hidden():
    hints = {"hf_token": 'set hf_token to "env:HF_TOKEN" or "file:/path/to/token", never to the token itself'}
    assert site_message({"hf_token": SECRET}, hints) == (
        "field 'hf_token': is not 'env:NAME' or 'file:PATH'; a secret never goes into the inventory in plain text "
        f"(got {HIDDEN}). Fix: set hf_token to \"env:HF_TOKEN\" or \"file:/path/to/token\", never to the token itself.")


def test_one_item_of_an_argument_list_shows_only_its_kind():
    """It may be the value of the --api-key before it."""
    assert site_message({"extra_args": ["--api-key", 12345]}) == (
        "field 'extra_args[1]': Input should be a valid string (got an int). Fix: write extra_args[1] as a quoted string.")


# ---------------------------------------------------------------- guesses


@pytest.mark.parametrize("word, choices, meant", [
    ("prot", ["port", "root"], "port"),  # two letters swapped
    ("PORT", ["port"], "port"),  # case
    ("readines_timeout", ["readiness_timeout", "start_timeout"], "readiness_timeout"),  # a letter left out
    ("tensor_parallel", ["tensor_parallel_size", "max_model_len"], "tensor_parallel_size"),  # a part of the name
    ("parallel", ["tensor_parallel_size", "pipeline_parallel_size"], None),  # which one: no guess
    ("zzzqqq", ["port", "root"], None),
    ("", ["port"], None),
    ("port", [], None),
])
def test_the_guess_is_what_the_operator_most_likely_meant_or_none(word, choices, meant):
    assert closest(word, choices) == meant


# ---------------------------------------------------------------- paths and hints


def test_a_field_path_is_written_as_in_messages():
    assert loc_path(("vllm", "version")) == "vllm.version"
    assert loc_path(("extra_args", 2)) == "extra_args[2]"
    assert loc_path(("serve", "env", "A")) == "serve.env.A"
    assert loc_path(()) == ""


def test_the_most_specific_hint_wins_and_a_list_index_is_ignored():
    hints = {"vllm": "VLLM", "vllm.version": "VERSION", "extra_args": "ARGS"}
    assert hint_for("vllm.version", hints) == "VERSION"
    assert hint_for("vllm.nightly", hints) == "VLLM"
    assert hint_for("extra_args[3]", hints) == "ARGS"
    assert hint_for("port", hints) is None


def test_the_model_of_a_nested_mapping():
    assert model_at(SiteSettings, ()) is SiteSettings
    assert model_at(SiteSettings, ("vllm",)) is VllmRuntime
    assert model_at(SiteSettings, ("site_source",)) is SiteSource  # optional: SiteSource | None
    assert model_at(SiteSettings, ("multinode",)) is MultiNode
    assert model_at(CatalogEntry, ("serve",)) is ServeDefaults
    assert model_at(SiteSettings, ("port",)) is None
    assert model_at(SiteSettings, ("nope",)) is None
    assert model_at(SiteSettings, ("extra_args", 0)) is None


# ---------------------------------------------------------------- one error, worded


def test_an_unknown_key_says_what_was_meant_and_how_to_fix_it():
    message = site_message({"prot": 8000})
    assert message.startswith("unknown key 'prot' (did you mean 'port'?); allowed keys: api_key, benchmark_tokens, ")
    assert message.endswith("Fix: rename 'prot' to 'port'.")
    assert site_message({"zzzqqq": 1}).endswith("wave_size, when_disk_too_small. Fix: remove 'zzzqqq'.")


def test_a_nested_key_given_at_the_top_is_moved_into_its_mapping():
    assert site_message({"version": "0.34.0"}).startswith("unknown key 'version' (did you mean 'vllm.version'?)")
    assert site_message({"version": "0.34.0"}).endswith("Fix: move it into 'vllm' as 'vllm.version'.")
    assert site_message({"vllm_version": "0.34.0"}).endswith("Fix: move it into 'vllm' as 'vllm.version'.")
    # --data vllm.version=... : one key with a dot, not a nested one
    assert site_message({"vllm.version": "0.34.0"}).startswith(
        "unknown key 'vllm.version' (a key of the 'vllm' dict, not a key of its own); allowed keys: ")


def test_an_unknown_key_in_a_nested_mapping_lists_that_mappings_keys():
    (error,) = errors_of(SiteSettings, {"model": "m", "vllm": VLLM, "multinode": {"node_rank": 0, "adress": "x"}})
    assert explain_error(error, SiteSettings, {}) == (
        "unknown key 'multinode.adress' in 'multinode' (did you mean 'multinode.address'?); allowed keys: address, "
        "engine, interface, master_port, node_rank, pipeline_parallel_size. Fix: rename 'adress' to 'address'.")


def test_the_caller_words_the_fix_of_an_unknown_key_where_it_knows_the_file():
    (error,) = errors_of(SiteSettings, {"model": "m", "vllm": VLLM, "prot": 1})
    message = explain_error(error, SiteSettings, {}, unknown_key_note=" (set in group_data/all.py)",
                            fix_for_unknown=lambda key, guess: f"rename {key!r} to {guess!r} in group_data/all.py")
    assert message.endswith("when_disk_too_small (set in group_data/all.py). Fix: rename 'prot' to 'port' in "
                            "group_data/all.py.")


def test_a_missing_field_says_what_to_add():
    (error,) = errors_of(SiteSettings, {"vllm": VLLM})
    assert explain_error(error, SiteSettings, {}) == "field 'model' is missing. Fix: add 'model'."
    assert explain_error(error, SiteSettings, {"model": "set model to a catalog entry, e.g. tiny-llama"}) == (
        "field 'model' is missing. Fix: set model to a catalog entry, e.g. tiny-llama.")


def test_a_wrong_type_says_what_was_given_and_what_to_write():
    assert site_message({"port": "http"}) == (
        "field 'port': Input should be a valid integer, unable to parse string as an integer (got 'http', a string). "
        "Fix: write port as a whole number.")
    # with the field's own hint, both: the type, then how to set it
    assert site_message({"port": "http"}, {"port": "set port to the TCP port vLLM listens on"}).endswith(
        "Fix: write port as a whole number; set port to the TCP port vLLM listens on.")


def test_a_value_out_of_bounds_or_choices_says_the_bound_or_the_choices():
    assert site_message({"port": 0}) == (
        "field 'port': Input should be greater than or equal to 1 (got 0). Fix: set port to a value >= 1.")
    assert site_message({"verify": "quick"}) == (
        "field 'verify': Input should be 'fast' or 'full' (got 'quick'). Fix: use one of 'fast' or 'full'.")
    assert site_message({"port": 0}, {"port": "set port to 1 to 65535"}).endswith("(got 0). Fix: set port to 1 to 65535.")


def test_a_validators_message_stands_without_its_prefix_and_the_value_once():
    (error,) = errors_of(CatalogEntry, {"description": "x", "hub": {"repo": "a/b"}, "serve": {"dtype": "bf16"}})
    # pydantic's "Value error, " goes; the value is in the message already, so no "(got 'bf16')"
    assert explain_error(error, CatalogEntry, {}) == (
        "field 'serve.dtype': 'bf16' is not a vLLM --dtype. Fix: correct serve.dtype.")


def test_a_rule_over_several_fields_uses_the_mappings_own_hint():
    (error,) = errors_of(CatalogEntry, {"description": "x", "hub": {"repo": "a/b", "allow_patterns": ["*.json"]}})
    assert explain_error(error, CatalogEntry, {}).startswith(
        "format is 'safetensors' but no hub.allow_patterns entry matches .safetensors files (got ")
    assert explain_error(error, CatalogEntry, {}).endswith(". Fix: correct the values named above.")
    assert explain_error(error, CatalogEntry, {"": "add a '*.safetensors' pattern"}).endswith(
        "Fix: add a '*.safetensors' pattern.")


def test_a_fix_is_one_sentence():
    assert site_message({"port": 0}, {"port": "set port to 8000."}).endswith("Fix: set port to 8000.")
    assert site_message({"port": 0}, {"port": "  set port to 8000  "}).endswith("Fix: set port to 8000.")


def test_a_file_is_named_relative_to_the_folder_the_run_started_in():
    """display_path's default base is the working folder (where pyinfra was started), not heavylift's repository."""
    here = Path.cwd()
    assert display_path(here / "inventory" / "site.py") == str(Path("inventory") / "site.py")
