"""Is the snapshot folder still what its manifest says (operations/weights.py WeightsManifest fact)?

Run as: python3 -c <this file> MANIFEST FOLDER; prints one JSON object.
"""

import json, os, sys
manifest, folder = sys.argv[1], sys.argv[2]
present, partial = {}, {}
download = os.path.join(folder, ".cache", "huggingface", "download")
for base, dirs, names in os.walk(download):
    for name in names:
        if name.endswith(".incomplete"):
            try:
                partial[os.path.relpath(os.path.join(base, name), download)] = os.lstat(os.path.join(base, name)).st_size
            except OSError:
                pass
for base, dirs, names in os.walk(folder):
    if base == folder and ".cache" in dirs:
        dirs.remove(".cache")
    for name in names:
        path = os.path.join(base, name)
        if os.path.isfile(path) and not os.path.islink(path):
            present[os.path.relpath(path, folder)] = os.stat(path).st_size
try:
    entries = json.load(open(manifest))["files"]
except (OSError, ValueError, KeyError):
    print(json.dumps({"state": "absent", "present": present, "partial": partial})); sys.exit(0)
changed = []
for name, want in entries.items():
    try:
        st = os.stat(os.path.join(folder, name))
    except OSError:
        changed.append(name); continue
    if st.st_size != want["size"] or st.st_mtime_ns != want["mtime_ns"]:
        changed.append(name)
print(json.dumps({"state": "changed" if changed else "complete", "changed": changed,
                  "files": sorted(entries), "bytes": sum(e["size"] for e in entries.values()),
                  "present": present, "partial": partial}))
