"""Does this interpreter still lend the packages a venv was built to reuse (operations/runtime.py host_packages)?

Run as: python3 -c <this file> WANTED_JSON; exits non-zero when one is missing or another version.
"""

import json, sys
from importlib import metadata
want = json.loads(sys.argv[1])
try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:
    try:  # pip's own copy, in images that have pip but not packaging
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.utils import canonicalize_name
    except ImportError:
        Requirement = None
problems = []
for name, site in want.items():
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        problems.append(f"{name}: not importable from the host's {site}")
        continue
    if str(dist.locate_file("")).rstrip("/") != site:
        problems.append(f"{name}: taken from {dist.locate_file('')}, not from the host's {site}")
if Requirement is None:
    print("host packages: versions not checked (no packaging module in the venv or on the host)")
hosted = {canonicalize_name(n) for n in want} if Requirement else set()
for dist in metadata.distributions(path=[p for p in sys.path if p.startswith(sys.prefix)]) if Requirement else []:
    for line in dist.requires or []:
        req = Requirement(line)
        if canonicalize_name(req.name) not in hosted or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        version = metadata.version(req.name)
        if not req.specifier.contains(version, prereleases=True):
            problems.append(f"{dist.metadata['Name']} requires {line}, the host has {req.name} {version}")
if problems:
    sys.exit("host packages do not fit this build: " + "; ".join(sorted(set(problems))))
print("host packages:", ", ".join(f"{n} {metadata.version(n)}" for n in want))
