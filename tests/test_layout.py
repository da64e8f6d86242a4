"""Every host path from one place (resolve/layout.py): the entry points, the site source and the host scripts ask it."""

import json

from models.schema import SiteSettings
from resolve.layout import DEFAULT_ROOT, Layout


def test_the_default_root_is_the_schemas():
    assert SiteSettings.model_fields["root"].default == DEFAULT_ROOT == Layout.of_host(None).root
    assert Layout.of_host("/srv/hl").root == "/srv/hl"


def test_a_deployments_paths_under_its_root():
    layout = Layout.of_host("/srv/hl").of("kimi")
    assert layout.deployment_dir == "/srv/hl/deployments/kimi"
    assert layout.release("r1") == "/srv/hl/deployments/kimi/releases/r1"
    assert layout.release_launcher("r1") == "/srv/hl/deployments/kimi/releases/r1/serve"
    assert layout.pidfile == "/srv/hl/deployments/kimi/run/serve.pid"
    assert layout.unit_path == "/etc/systemd/system/heavylift-kimi.service"
    assert layout.lock == "/srv/hl/deploy.lock"
    assert layout.resolution_file == "/srv/hl/deployments/kimi/resolution.json"
    assert layout.site_source_headers == "/srv/hl/deployments/kimi/private/site-source.headers"


def test_the_site_sources_paths():
    source = Layout.of_host("/srv/hl").site_source
    assert (source.folder, source.models, source.launcher) == ("/srv/hl/site-source", "/srv/hl/models", "/srv/hl/site-source/serve")
    assert (source.env_file, source.pidfile, source.logfile) == (
        "/srv/hl/site-source/private/source.env", "/srv/hl/site-source/run/serve.pid", "/srv/hl/site-source/run/serve.log")
    assert source.unit_path == "/etc/systemd/system/heavylift-site-source.service"


def test_host_state_gets_the_same_paths_with_placeholders():
    """scripts/host_state.py fills {name}, {release}, {repo} and {commit} in; what it reads is what a deploy wrote."""
    host = Layout.of_host("/srv/hl")
    paths = json.loads(json.dumps(host.host_state_paths()))

    def fill(key, **values):
        path = paths[key]
        for placeholder, value in values.items():
            path = path.replace("{" + placeholder + "}", value)
        return path

    kimi = host.of("kimi")
    assert fill("pidfile", name="kimi") == kimi.pidfile
    assert fill("logfile", name="kimi") == kimi.logfile
    assert fill("unit", name="kimi") == kimi.unit_path
    assert fill("release_venv", name="kimi", release="r1") == kimi.release_venv("r1")
    assert fill("content", repo="org--m", commit="c" * 40) == host.content("org/m", "c" * 40)
    assert fill("status", name="kimi") == kimi.status_file
