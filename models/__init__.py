"""The model catalog (models/<name>.yaml), its schema, and validation of a host's data against it."""

from .catalog import CATALOG_ENV, catalog_folder, list_entries, load_entry, load_entry_file
from .errors import HeavyliftConfigError
from .schema import CatalogEntry, SiteSettings
from .validate import DataSources, Deployment, load_deployment

__all__ = [
    "CATALOG_ENV",
    "CatalogEntry",
    "DataSources",
    "Deployment",
    "HeavyliftConfigError",
    "SiteSettings",
    "catalog_folder",
    "list_entries",
    "load_deployment",
    "load_entry",
    "load_entry_file",
]
