"""Validate: a pyinfra host's data plus its catalog entry -> a Deployment, or a clear error.

``deploy.py`` starts with ``deployment = load_deployment(host)``. pyinfra runs deploy.py once
per host in its prepare phase, before anything is executed on any host; the first call
validates every active host of the inventory, so one typo anywhere stops the whole run
before a single host is touched, and all problems are reported together.

Where a value came from is part of every message: the inventory file, a group_data file,
``--data`` on the command line. pyinfra's own data (connector settings such as ``ssh_*``,
operation arguments such as ``_sudo``) is left alone.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from .catalog import catalog_folder, list_entries, load_entry, unknown_model
from .errors import HeavyliftConfigError, combine, display_path, explain_error
from resolve.layout import DEFAULT_ROOT

from .schema import CatalogEntry, SiteSettings, VllmRuntime

if TYPE_CHECKING:
    from pyinfra.api.host import Host
    from pyinfra.api.inventory import Inventory
    from pyinfra.api.state import State

# data keys that belong to pyinfra, not heavylift: connector settings and operation arguments.
# From pyinfra 3.10: connectors/ssh.py (ssh_*), docker.py (docker_*, also used by @podman),
# dockerssh.py (docker_image, docker_container_id), chroot.py (chroot_directory), fake.py
# (fake_*), api/inventory.py (winrm_*), operation arguments in host data (_sudo, _env, ...);
# terraform_/vagrant_/local_ are reserved for their connectors.
PYINFRA_PREFIXES = (
    "_",
    "ssh_",
    "winrm_",
    "docker_",
    "dockerssh_",
    "podman_",
    "podmanssh_",
    "chroot_",
    "local_",
    "terraform_",
    "vagrant_",
    "fake_",
)

EXAMPLE_VLLM = '{"version": "0.34.0"}'
SECRET_FIELDS = ("hf_token", "api_key")

# how to fix a bad value, by dotted field path (the most specific one wins): only where the fix says more than the
# schema's Field(description=...) and bounds (a format, an example, where to set it); every other field's fix is
# built from the schema (schema_hints), the one place a field is described
SITE_HINTS: dict[str, str] = {
    "deployment": "use lower-case letters, digits, '.', '_' and '-' (starting with a letter or digit, at most 63 "
    "characters), e.g. deployment=\"kimi-prod\", or remove it to use the model name",
    "bind_address": 'set bind_address to an IP address such as "127.0.0.1" or "0.0.0.0", or a host name',
    "root": f'set root to an absolute folder such as "{DEFAULT_ROOT}"',
    "hf_endpoint": 'set hf_endpoint to the mirror\'s URL, e.g. "http://10.0.0.5:8090", or remove it to use the public Hub',
    "vllm": f"set vllm to a dict such as {EXAMPLE_VLLM} (a release), {{\"nightly\": \"latest\"}} or {{\"nightly\": "
    f"\"<full commit>\"}} (keys: {', '.join(VllmRuntime.model_fields)})",
    "vllm.version": 'give vllm.version as an exact PEP 440 version in quotes, e.g. "0.34.0" or "0.16.0rc2.dev314+gf72061a19"',
    "vllm.index_url": "give vllm.index_url as an http(s) URL (e.g. https://wheels.vllm.ai/<full-commit-sha>/), a file:// "
    "URL or an absolute path, or remove it",
    "vllm.find_links": "give vllm.find_links as a list of folders or URLs on the host",
    "vllm.extra_packages": 'give vllm.extra_packages as a list of requirement strings, e.g. ["vllm-gguf-plugin"]',
    "vllm.exclude_packages": 'give vllm.exclude_packages as a list of package names, e.g. ["torchvision"]',
    "vllm.python": 'give vllm.python as the interpreter on the host, e.g. "python3"',
    "vllm.nightly": 'set vllm.nightly to "latest" or to a full 40-hex vLLM commit (git rev-parse of the commit), and give '
    'no version with "latest"',
    "vllm.variant": 'set vllm.variant to a wheel variant vLLM publishes, e.g. "cu130", "cu129" or "cpu", or remove it for '
    "the index's default build",
    "vllm.wheel_index": 'give vllm.wheel_index as the base URL of vLLM\'s wheel indexes, e.g. "https://wheels.vllm.ai"',
    "vllm.patches": 'list patch files by their path in the heavylift repository, e.g. ["patches/glm-5/01-gguf-loader.patch"]',
    "vllm.wheelhouse": 'set vllm.wheelhouse to an absolute folder of wheels on the host, e.g. "/srv/wheelhouse"',
    "vllm.wheelhouse_upload": "set vllm.wheelhouse_upload to a folder of wheels on this machine (with vllm.wheelhouse, "
    "where it goes on the host), or remove it",
    "site_source": 'set site_source to a dict naming the host that fetches from the Hub and serves the others, e.g. '
    '{"host": "gpu-node-1"} (keys: host, port, address, bind_address, wait_seconds), or remove it',
    "site_source.address": 'set site_source.address to the IP address or name the other hosts reach the source by, '
    'e.g. "10.0.0.11", or remove it to use its ssh_hostname',
    "site_source.bind_address": 'set site_source.bind_address to an IP address such as "0.0.0.0" or "10.0.0.11"',
    "uv_version": 'give uv_version as an exact PEP 440 version in quotes, e.g. "0.13.9"',
    "uv_cache_dir": 'set uv_cache_dir to an absolute folder on the host, e.g. "/var/cache/uv", or remove it to use '
    "<root>/cache/uv",
    "extra_args": 'give extra_args as a list of strings, one vLLM argument per item, e.g. ["--enable-prefix-caching"]; '
    "use the dedicated keys (port, bind_address, tensor_parallel_size, max_model_len) for what they cover",
    "env": 'give env as a dict of names to quoted strings, e.g. {"VLLM_LOGGING_LEVEL": "DEBUG"}',
    "readiness_timeout": "set readiness_timeout to the seconds to wait for the model (at least 10; 500 GB checkpoints "
    "need 3600 or more)",
    "hf_token": 'set hf_token to "env:HF_TOKEN" (read from the control machine\'s environment) or "file:/path/to/token" '
    "(a file on the control machine, mode 0600), never to the token itself",
    "api_key": 'set api_key to "env:VLLM_API_KEY" or "file:/path/to/key" on the control machine, never to the key itself',
    "wave_size": "set wave_size to how many hosts of the deployment switch, restart and pass the gate at a time (1 or "
    "more), e.g. wave_size = 2, in the group_data file of the deployment's hosts, or remove it to roll all at once",
    "max_unavailable": 'set max_unavailable to a number of hosts (e.g. 2) or a share of the deployment\'s hosts (e.g. "25%"); '
    "with wave_size set too, remove one of the two",
}


@lru_cache(maxsize=1)
def schema_hints() -> dict[str, str]:
    """A fix for every site field from the schema: its description, choices, bounds and default
    (models/settings_doc.py reads the same for docs/settings.md)."""
    # imported here: `python -m models.settings_doc` runs that module after models/__init__ imported this one
    from .settings_doc import SECTIONS, field_fix

    return {
        f"{under}.{name}" if under else name: field_fix(f"{under}.{name}" if under else name, field)
        for model, under in SECTIONS
        for name, field in model.model_fields.items()
    }


def is_pyinfra_key(key: str) -> bool:
    return key.startswith(PYINFRA_PREFIXES) or key in _connector_data_keys()


@lru_cache(maxsize=1)
def _connector_data_keys() -> frozenset[str]:
    """Every data key a pyinfra connector declares (``data_meta``), plus those set by connectors."""
    keys = {"docker_image", "docker_container_id", "chroot_directory"}
    try:
        from pyinfra.api.connectors import get_all_connectors

        for connector in get_all_connectors().values():
            keys.update(getattr(connector, "data_meta", {}) or {})
    except Exception:  # pragma: no cover - a broken third-party connector must not block validation
        pass
    return frozenset(keys)


def heavylift_data(host: Host, command_keys: Collection[str] = ()) -> dict[str, Any]:
    """The host's merged data (override, host, groups, all) without pyinfra's own keys, nor ``command_keys``: the
    options of the entry point that validates (``--data release=...`` for rollback.py), given by it on each call,
    so a key one command takes is still refused as unknown by the others (deploy.py)."""
    return {key: value for key, value in host.data.dict().items() if not is_pyinfra_key(key) and key not in command_keys}


# ---------------------------------------------------------------- where data came from


@dataclass(frozen=True)
class DataSources:
    """The files pyinfra read an inventory's data from, to name them in messages.

    ``inventory_file`` is None when the inventory was a host list on the command line.
    ``group_data_dirs`` are in pyinfra's load order: a later one overrides an earlier one.
    """

    cwd: Path
    inventory_file: Path | None
    group_data_dirs: tuple[Path, ...] = ()
    override_label: str = "--data on the command line"

    @classmethod
    def for_inventory(
        cls, inventory_file: str | os.PathLike | None, cwd: str | os.PathLike | None = None, group_data: tuple = ()
    ) -> DataSources:
        """What pyinfra 3.10's CLI reads (pyinfra_cli/inventory.py make_inventory_from_files):
        ``<cwd>/group_data``, then ``group_data`` beside the inventory file, then ``--group-data``."""
        base = Path(cwd) if cwd else Path.cwd()
        inventory = Path(inventory_file) if inventory_file else None
        if inventory is not None and not inventory.is_absolute():
            inventory = base / inventory
        dirs = [base / "group_data"]
        if inventory is not None and str(inventory.parent.resolve()) != str(base):
            dirs.append(inventory.parent.resolve() / "group_data")
        dirs.extend(Path(d) if Path(d).is_absolute() else base / d for d in group_data)
        return cls(cwd=base, inventory_file=inventory if inventory and inventory.is_file() else None, group_data_dirs=tuple(dirs))

    @classmethod
    def of_run(cls, context) -> DataSources:
        """The sources of a run (resolve/context.py RunContext: the folder pyinfra ran in, the inventory
        file, --group-data), in pyinfra 3.10's load order."""
        return cls.for_inventory(context.inventory, context.cwd, tuple(str(d) for d in context.group_data))

    # ------------------------------------------------------------ lookups

    def show(self, path: Path) -> str:
        return display_path(path, self.cwd)

    @property
    def inventory_label(self) -> str | None:
        return self.show(self.inventory_file) if self.inventory_file else None

    def group_files(self, group: str) -> list[Path]:
        """group_data files for ``group``, in load order (the last one wins)."""
        found = []
        for entry in self.group_data_dirs:
            candidate = entry if entry.is_file() else entry / f"{group}.py"
            if candidate.is_file() and candidate.stem == group and candidate.suffix == ".py":
                found.append(candidate)
        return found

    def group_label(self, group: str, key: str) -> str:
        files = self.group_files(group)
        for path in reversed(files):
            if key in _module_names(path):
                return self.show(path)
        if self.inventory_file is not None and (group == "all" or group in _module_names(self.inventory_file)):
            return self.inventory_label or ""
        if files:
            return self.show(files[-1])
        return self.inventory_label or f"the data of group {group!r}"


@lru_cache(maxsize=256)
def _module_names_cached(path: str, mtime: float) -> frozenset[str]:
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return frozenset()
    names: set[str] = set()
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Name):
                    names.add(sub.id)
    return frozenset(names)


def _module_names(path: Path) -> frozenset[str]:
    """Names a Python file assigns at module level (what pyinfra turns into group data)."""
    try:
        return _module_names_cached(str(path), path.stat().st_mtime)
    except OSError:
        return frozenset()


@dataclass(frozen=True)
class Origin:
    """Where one data key of one host was set."""

    label: str  # a file as the user wrote it, or "--data on the command line"
    kind: str  # "override", "host", "group", "all", "deploy", "unknown"
    group: str | None = None

    @property
    def is_file(self) -> bool:
        return self.kind in ("host", "group", "all") and self.label.endswith(".py")


def origin_of(host: Host, key: str, sources: DataSources | None) -> Origin:
    """The layer of pyinfra's data waterfall (override, host, group, all) that supplies ``key``."""
    inventory = host.inventory
    inventory_label = (sources.inventory_label if sources else None) or None
    if key in host.data.override_datas:
        return Origin("deploy code (host.data." + key + " = ...)", "deploy")
    if key in inventory.get_override_data():
        return Origin(sources.override_label if sources else "override data", "override")
    if key in host.host_data:
        return Origin(inventory_label or f"the host data of {host.name!r}", "host")
    for group in reversed(list(host.groups)):
        if key in inventory.get_group_data(group):
            label = sources.group_label(group, key) if sources else f"the data of group {group!r}"
            return Origin(label, "group", group)
    if key in inventory.get_data():
        label = sources.group_label("all", key) if sources else "the inventory's global data"
        return Origin(label, "all", "all")
    return Origin(inventory_label or f"the data of {host.name!r}", "unknown")


def _prefix(host: Host, origin: Origin) -> str:
    group = f" (group {origin.group!r})" if origin.group and origin.group != "all" else ""
    return f"{origin.label}, host {host.name!r}{group}: "


def _host_label(host: Host, sources: DataSources | None) -> str:
    label = sources.inventory_label if sources else None
    return label or f"the inventory data of {host.name!r}"


# ---------------------------------------------------------------- the result


@dataclass(frozen=True)
class Deployment:
    """One host's validated desired state: its site settings and the catalog entry they name."""

    name: str  # the deployment name: settings.deployment, else the model name
    settings: SiteSettings
    entry: CatalogEntry
    entry_file: Path

    @property
    def tensor_parallel_size(self) -> int:
        return self.settings.tensor_parallel_size or self.entry.serve.tensor_parallel_size

    @property
    def max_model_len(self) -> int | None:
        return self.settings.max_model_len or self.entry.serve.max_model_len


# ---------------------------------------------------------------- validation


def _unknown_key_fix(origin: Origin, key: str, guess: str | None) -> str:
    where = origin.label if origin.is_file else "the host's data"
    # a nested dict's key given at the top ('version', 'vllm_version'; or 'vllm.version' through --data)
    nested = guess is not None and (guess.count(".") > key.count(".") or guess == key)
    if origin.kind == "override":
        if nested:
            head, tail = guess.split(".", 1)
            return f"--data does not nest keys: pass the whole dict as JSON, --data '{head}={{\"{tail}\": ..., ...}}'"
        return f"pass --data {guess}=... instead" if guess else f"drop --data {key}=..."
    if nested:
        head, tail = guess.split(".", 1)
        return f"move it into the {head!r} dict as {tail!r} in {where}"
    if guess:
        return f"rename {key.rsplit('.', 1)[-1]!r} to {guess.rsplit('.', 1)[-1]!r} in {where}"
    text = f"remove {key!r} from {where}"
    if origin.kind in ("group", "all") and origin.is_file and Path(origin.label).parent.name == "group_data":
        text += " (pyinfra passes every module-level variable of a group_data file as data: give helper variables a leading '_')"
    return text


def _settings_problems(host: Host, data: dict[str, Any], sources: DataSources | None, catalog: Path) -> list[str]:
    try:
        SiteSettings.model_validate(data)
        return []
    except ValidationError as err:
        errors = err.errors()
    problems = []
    for error in errors:
        loc = tuple(error["loc"])
        top = str(loc[0]) if loc else None
        if error["type"] == "missing" and loc == ("model",):
            problems.append(_missing_model(host, sources, catalog))
            continue
        if top is None or error["type"] == "missing" and len(loc) == 1:
            origin = Origin(_host_label(host, sources), "host")
        else:
            origin = origin_of(host, top, sources)
        if error["type"] == "missing" and loc == ("vllm",):
            problems.append(
                f"{_host_label(host, sources)}, host {host.name!r}: field 'vllm' is missing: heavylift needs to know which "
                f"vLLM build to install. Fix: add vllm={EXAMPLE_VLLM} to the host's data or to a group_data file "
                f"(keys: {', '.join(VllmRuntime.model_fields)})."
            )
            continue
        if top in SECRET_FIELDS:
            # the rejected value may be the secret itself: never repeat it
            error = {key: value for key, value in error.items() if key != "input"}
        text = explain_error(
            error,
            SiteSettings,
            {**schema_hints(), **SITE_HINTS},
            fix_for_unknown=lambda key, guess, origin=origin: _unknown_key_fix(origin, key, guess),
        )
        problems.append(_prefix(host, origin) + text)
    return problems


def _missing_model(host: Host, sources: DataSources | None, catalog: Path) -> str:
    label = _host_label(host, sources)
    try:
        names = list_entries(catalog)
    except HeavyliftConfigError:
        names = []
    example = "tiny-llama" if "tiny-llama" in names or not names else names[0]
    groups = [g for g in host.groups if not g.startswith("@")]
    group_hint = f" or to group_data/{groups[0]}.py (model = \"{example}\")" if groups else ""
    entry = f'("{host.name}", {{"model": "{example}", ...}})'
    return (
        f"{label}, host {host.name!r}: no 'model' is set, so heavylift does not know what to serve. "
        f'Fix: add "model": "<name>" to the host\'s data in {label} (e.g. {entry}){group_hint}; '
        f"catalog models: {', '.join(names) or 'none'}."
    )


class _Catalog:
    """Catalog lookups shared by all hosts of one validation: each file is read once."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._names: list[str] | None = None
        self.entries: dict[str, CatalogEntry | HeavyliftConfigError] = {}

    @property
    def names(self) -> list[str]:
        if self._names is None:
            self._names = list_entries(self.folder)
        return self._names

    def entry(self, name: str) -> CatalogEntry | HeavyliftConfigError:
        if name not in self.entries:
            try:
                self.entries[name] = load_entry(name, self.folder)
            except HeavyliftConfigError as err:
                self.entries[name] = err
        return self.entries[name]


def _check_host(
    host: Host, sources: DataSources | None, catalog: _Catalog, command_keys: Collection[str] = ()
) -> Deployment | list[str] | str:
    """A Deployment; or the problems (lines); or the name of an unsupported model it asks for."""
    data = heavylift_data(host, command_keys)
    problems = _settings_problems(host, data, sources, catalog.folder)
    if problems:
        return problems
    settings = SiteSettings.model_validate(data)

    name = settings.model
    if name not in catalog.names:
        return [_prefix(host, origin_of(host, "model", sources)) + "field 'model': " + unknown_model(name, catalog.folder)]
    entry = catalog.entry(name)
    if isinstance(entry, HeavyliftConfigError):
        return entry.problems
    if entry.support.status == "unsupported":
        return name
    return Deployment(
        name=settings.deployment or name, settings=settings, entry=entry, entry_file=catalog.folder / f"{name}.yaml"
    )


def _unsupported(
    name: str, users: list[tuple[Host, Origin]], catalog: _Catalog, sources: DataSources | None, gpus_of=None
) -> str:
    entry = catalog.entry(name)
    assert isinstance(entry, CatalogEntry)
    shown = display_path(catalog.folder / f"{name}.yaml", sources.cwd if sources else None)
    by_file: dict[str, list[str]] = {}
    for host, origin in users:
        # the host's own GPUs (a fact read, no change): the entry's reason speaks of the rollout's
        by_file.setdefault(origin.label, []).append(repr(host.name) + (f" ({gpus_of(host)})" if gpus_of else ""))
    chosen = "; ".join(f"host{'s' if len(h) > 1 else ''} {', '.join(h)} in {label}" for label, h in by_file.items())
    reason = entry.support.reason.strip().rstrip(".")
    fix = entry.support.fix.strip().rstrip(".")
    return f"{shown}: model {name!r} is not supported by heavylift (chosen for {chosen}): {reason}. Fix: {fix}. No host was changed."


def validate_hosts(
    hosts: list[Host],
    catalog_dir: str | os.PathLike | None = None,
    sources: DataSources | None = None,
    gpus_of=None,
    command_keys: Collection[str] = (),
) -> tuple[dict[str, Deployment], list[str]]:
    """Every host's Deployment, and every problem found (one line each, each naming its file).

    + gpus_of: host -> one line naming its GPUs, for the refusal of an unsupported model
    + command_keys: the data keys the calling entry point takes as its own options (not site keys)
    """
    catalog = _Catalog(catalog_folder(catalog_dir))
    if sources is None:
        sources = _sources_of_this_run()
    deployments: dict[str, Deployment] = {}
    problems: list[str] = []
    unsupported: dict[str, list[tuple[Host, Origin]]] = {}
    for host in hosts:
        result = _check_host(host, sources, catalog, command_keys)
        if isinstance(result, Deployment):
            deployments[host.name] = result
        elif isinstance(result, str):
            unsupported.setdefault(result, []).append((host, origin_of(host, "model", sources)))
        else:
            problems.extend(result)
    for name, users in unsupported.items():
        problems.append(_unsupported(name, users, catalog, sources, gpus_of))
    problems.extend(_site_source_problems(hosts, deployments, sources))
    return deployments, problems


def _sources_of_this_run() -> DataSources | None:
    """The running pyinfra CLI's sources (None outside the CLI: API use, tests)."""
    import pyinfra

    if not getattr(pyinfra, "is_cli", False):
        return None
    from pyinfra import state
    from resolve.context import RunContext

    return DataSources.of_run(RunContext.of_pyinfra(state))


def _site_source_problems(hosts: list[Host], deployments: dict[str, Deployment], sources: DataSources | None) -> list[str]:
    """The site source against the whole inventory: it names one of its hosts, which deploys the same
    checkpoint and names itself (so it fetches from the Hub and serves), on a port vLLM does not use."""
    if not hosts:
        return []
    names = [h.name for h in hosts[0].inventory]
    problems = []
    for host in hosts:
        deployment = deployments.get(host.name)
        wanted = deployment.settings.site_source if deployment else None
        if wanted is None:
            continue
        where = _prefix(host, origin_of(host, "site_source", sources)) + "field 'site_source"
        if wanted.host not in names:
            problems.append(
                f"{where}.host': {wanted.host!r} is not a host of this inventory (hosts: {', '.join(names)}). "
                "Fix: name the host that fetches the checkpoint from the Hub and serves the others."
            )
            continue
        source = deployments.get(wanted.host)
        if source is None:  # not in this run (--limit) or invalid itself: the fetch says whether it serves
            continue
        theirs = source.settings.site_source
        if theirs is None or theirs.host != wanted.host or theirs.port != wanted.port:
            problems.append(
                f"{where}': host {wanted.host!r} is the site source here, but its own data "
                + ("has no site_source" if theirs is None else f"says site_source host {theirs.host!r} port {theirs.port}")
                + ", so it would not serve. Fix: give every host of the site the same site_source (a group_data file)."
            )
        elif (source.entry.hub.repo, source.entry.hub.revision) != (deployment.entry.hub.repo, deployment.entry.hub.revision):
            problems.append(
                f"{where}.host': the site source {wanted.host!r} deploys {source.entry.hub.repo}@{source.entry.hub.revision} "
                f"(model {source.settings.model!r}), not {deployment.entry.hub.repo}@{deployment.entry.hub.revision}. "
                "Fix: name a source host that deploys the same model, or give the hosts of each model their own site_source."
            )
        if wanted.host == host.name and wanted.port == deployment.settings.port:
            problems.append(
                f"{where}.port': {wanted.port} is also the port vLLM serves on (field 'port'). "
                "Fix: give the site source another port (default 8391)."
            )
    return problems


# where a run keeps what it validated, by catalog folder: an attribute of the run's own object (``run_of``)
RESULTS_ATTRIBUTE = "heavylift_validated"


def run_of(host: Host) -> State | Inventory:
    """The object one run's fleet-wide results are kept on (this module's validation, resolve/nodes.py's group
    plan): pyinfra's State, one per run (``State.init`` ties it to its inventory), or the inventory itself where it
    has no State (API use, tests). An attribute of that object, not a module's dict keyed by it: two runs in one
    process never share results, they go with the run's objects, and pyinfra's context proxy (``from pyinfra import
    state``, which defines ``__eq__`` but no ``__hash__``) can never be a key in their place."""
    inventory = host.inventory
    state = getattr(inventory, "state", None)  # set by State.init; an inventory without a State has none
    return state if state is not None else inventory


def _results_of(host: Host) -> dict[tuple[str, frozenset[str]], tuple[dict[str, Deployment], list[str]]]:
    """This run's validation results by catalog folder and command keys: (every active host's Deployment, the
    problems found)."""
    return vars(run_of(host)).setdefault(RESULTS_ATTRIBUTE, {})


def _hosts_to_check(host: Host) -> list[Host]:
    try:
        active = set(host.inventory.get_active_hosts())
    except AttributeError:  # an inventory without a pyinfra State (API use)
        active = set()
    hosts = [h for h in host.inventory if h in active]
    if host not in hosts:
        hosts.append(host)
    return hosts


def load_deployment(
    host: Host,
    catalog_dir: str | os.PathLike | None = None,
    sources: DataSources | None = None,
    gpus_of=None,
    command_keys: Collection[str] = (),
) -> Deployment:
    """The validated Deployment of ``host``; raises HeavyliftConfigError if any active host's data is bad.

    + host: the pyinfra host (``from pyinfra import host`` in deploy.py)
    + catalog_dir: the catalog folder; default $HEAVYLIFT_CATALOG, else models/ of heavylift
    + sources: where the inventory's data came from; default: read from the pyinfra CLI's arguments
    + gpus_of: host -> one line naming its GPUs (deploy.py reads the host's fact), named in the refusal of
      an unsupported model
    + command_keys: the data keys the entry point takes as its own options, left out of the site's data
      (rollback.py: ``release``); deploy.py takes none, so any such key is refused there as unknown

    The first call validates every active host of the inventory and keeps the result for
    the other hosts' calls in the same run, on the run's own object (``run_of``), by catalog
    folder and command keys.
    """
    catalog = catalog_folder(catalog_dir)
    per_run = _results_of(host)
    key = (str(catalog.resolve()), frozenset(command_keys))
    if key not in per_run or host.name not in per_run[key][0] and not per_run[key][1]:
        per_run[key] = validate_hosts(_hosts_to_check(host), catalog, sources, gpus_of, command_keys)
    deployments, problems = per_run[key]
    if problems:
        raise combine(problems)
    return deployments[host.name]


def operator_settings(host: Host, keys: Collection[str]) -> dict[str, Any]:
    """The site fields an operator command (status.py, retire.py) reads from ``host``'s data (its root, its service
    user), each validated as deploy.py validates it and defaulted where unset. A bad one is refused naming its file
    and field, before the command reads or changes anything. The rest of the site is not validated: these commands
    work from what the host has, also a deployment the site no longer names or whose model left the catalog."""
    sources = _sources_of_this_run()
    values, problems = {}, []
    for key in keys:
        given = host.data.get(key)
        if given is None:
            values[key] = SiteSettings.model_fields[key].default
            continue
        try:
            checked = SiteSettings.__pydantic_validator__.validate_assignment(SiteSettings.model_construct(), key, given)
        except ValidationError as err:
            origin = origin_of(host, key, sources)
            problems += [_prefix(host, origin) + explain_error(error, SiteSettings, {**schema_hints(), **SITE_HINTS})
                         for error in err.errors()]
            continue
        values[key] = getattr(checked, key)
    if problems:
        raise combine(problems)
    return values


def validated_deployments(host: Host) -> dict[str, Deployment]:
    """Every active host's Deployment in this run, by host name: what ``load_deployment`` validated
    together (the fleet-wide checks, such as the waves of resolve/waves.py, read it)."""
    for deployments, problems in _results_of(host).values():
        if host.name in deployments and not problems:
            return deployments
    load_deployment(host)
    return validated_deployments(host)
