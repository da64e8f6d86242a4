"""docs/settings.md is generated from the schema (models/settings_doc.py) and every option is described there,
in one place: the field's Field(description=...)."""

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from models.schema import SiteSettings
from models.settings_doc import SECTIONS, settings_markdown

ROOT = Path(__file__).resolve().parent.parent


def test_docs_are_generated_from_the_schema():
    doc = (ROOT / "docs" / "settings.md").read_text()
    assert doc == settings_markdown(), "docs/settings.md is stale: python -m models.settings_doc --markdown > docs/settings.md"


def test_the_module_command_prints_the_page():
    printed = subprocess.run([sys.executable, "-m", "models.settings_doc", "--markdown"], cwd=ROOT, capture_output=True,
                             text=True, check=True)
    assert printed.stdout == settings_markdown() and printed.stderr == ""


@pytest.mark.parametrize("model, under", SECTIONS, ids=[model.__name__ for model, _ in SECTIONS])
def test_every_key_is_described_with_its_type_and_default(model, under):
    doc = settings_markdown()
    for name, field in model.model_fields.items():
        key = f"{under}.{name}" if under else name
        assert field.description and field.description.strip(), f"{model.__name__}.{name} has no Field(description=...)"
        assert f"| `{key}` | " in doc


def test_every_model_a_site_can_nest_has_its_section():
    nested = set()
    for field in SiteSettings.model_fields.values():
        for kind in (field.annotation, *getattr(field.annotation, "__args__", ())):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                nested.add(kind)
    assert nested <= {model for model, _ in SECTIONS}


def test_a_row_shows_type_and_default():
    doc = settings_markdown()
    assert "| `port` | `int`, 1 to 65535 | `8000` | the TCP port vLLM listens on (--port) |" in doc
    assert "| `max_model_len` | `int`, at least 16 | unset | " in doc
    assert "&lt;root&gt;/cache/uv when unset" in doc  # not an HTML tag
    assert '| `verify` | `"fast"` or `"full"` | `"fast"` | ' in doc
    assert "| `model` | `str` | required | " in doc
    assert "| `gpus` | list of `int` | unset | " in doc
    assert "| `vllm` | dict ([VllmRuntime](#vllmruntime)) | required | " in doc
    assert "| `vllm.find_links` | list of `str` | `[]` | " in doc
