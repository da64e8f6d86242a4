"""The Requires-Dist lines of PACKAGE==VERSION's wheel in FOLDER (operations/runtime.py WheelRequirements).

Run as: python3 -c <this file> FOLDER PACKAGE VERSION; ends with '#found' when the wheel is there.
"""

import re, sys, zipfile
from pathlib import Path
folder, package, version = sys.argv[1:]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
for wheel in sorted(Path(folder).glob("*.whl")):
    name, _, rest = wheel.name.partition("-")
    if norm(name) == norm(package) and rest.split("-")[0] == version:
        with zipfile.ZipFile(wheel) as archive:
            meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            for line in archive.read(meta).decode().splitlines():
                if line.startswith("Requires-Dist:"):
                    print(line.split(":", 1)[1].strip())
        print("#found")
        break
