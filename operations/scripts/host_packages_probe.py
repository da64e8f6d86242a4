"""The versions of the named distributions this interpreter has (operations/runtime.py HostPackages fact).

Run as: python3 -c <this file> NAME...; prints one JSON object.
"""

import json, sys
from importlib import metadata
found = {}
for name in sys.argv[1:]:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue
    found[name] = {"version": dist.version, "site": str(dist.locate_file("")).rstrip("/")}
print(json.dumps({"python": "%d.%d" % sys.version_info[:2], "packages": found}))
