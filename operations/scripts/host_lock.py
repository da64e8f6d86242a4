"""The deploy lock on the host (operations/hostlock.py): take, look at or give back <root>/.heavylift.lock.

Run as: python3 -c <this file> PATH LABEL MODE [GENERATION] (standard library only).

MODE: take, release, or look (one JSON line: state free/held/stale, the holder, the generation;
a dry run only looks). Every take counts a generation in PATH.generation; a take given the GENERATION a
run read before (operations/hostlock.py: a run takes the lock at its first change) fails with exit
76 when another run took the lock since.
"""

import json, os, sys, time
path, label, mode = sys.argv[1], sys.argv[2], sys.argv[3]
expected = int(sys.argv[4]) if len(sys.argv) > 4 else None
GENERATION = path + ".generation"
CHANGED = 76
# shells and privilege tools between the connection and this script
SKIP = {"sh", "bash", "dash", "sudo", "su", "doas", "timeout", "setsid"}

def stat(pid):
    with open(f"/proc/{pid}/stat") as handle:
        text = handle.read()
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return comm, int(fields[1]), fields[19]  # comm, ppid, starttime

def holder():
    pid = os.getppid()
    while pid > 1:
        comm, ppid, start = stat(pid)
        if comm not in SKIP:
            return {"pid": pid, "comm": comm, "start": start}
        pid = ppid
    return {"pid": os.getppid(), "comm": "?", "start": stat(os.getppid())[2]}

def alive(record):
    try:
        return stat(record["pid"])[2] == record["start"]
    except (OSError, ValueError, KeyError, TypeError):
        return False

def describe(record):
    return (f"{record.get('label', '?')} since {record.get('since', '?')} "
            f"(host process {record.get('pid')} {record.get('comm', '?')})")

def read(path):
    for _ in range(20):  # a lock being created has its holder file within milliseconds
        try:
            with open(os.path.join(path, "holder.json")) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            time.sleep(0.05)
    return {}

def generation():
    try:
        with open(GENERATION) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {"generation": 0}

if mode == "look":
    record = read(path) if os.path.isdir(path) else None
    state = "free" if record is None else "held" if alive(record) else "stale"
    print(json.dumps({"state": state, "holder": describe(record) if record is not None else None,
                      "generation": generation().get("generation", 0)}))
    sys.exit(0)
if mode == "release":
    record = read(path) if os.path.isdir(path) else None
    mine = holder()
    if record is None:
        print("free")
    elif (record.get("pid"), record.get("start")) != (mine["pid"], mine["start"]):
        print(f"not ours: {describe(record)}")
    else:
        aside = f"{path}.released.{os.getpid()}"
        os.rename(path, aside)
        os.system(f"rm -rf '{aside}'")
        print(f"released: {describe(record)}")
    sys.exit(0)
os.makedirs(os.path.dirname(path), exist_ok=True)
for attempt in range(3):
    record = read(path) if os.path.isdir(path) else None
    if record is not None and alive(record):
        print(f"locked by {describe(record)}: {path}")
        sys.exit(75)
    if record is not None:
        aside = f"{path}.stale.{os.getpid()}"
        try:
            os.rename(path, aside)  # one of several recovering runs wins
            print(f"recovered a stale lock of {describe(record)}")
            os.system(f"rm -rf '{aside}'")
        except OSError:
            pass
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        continue
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    counted = generation()
    if expected is not None and counted.get("generation", 0) != expected:
        os.rmdir(path)  # not taken: empty, and only this run knows it
        print(f"another run changed the host after this run read it: {counted.get('label', '?')} took the lock at "
              f"{counted.get('since', '?')} (generation {counted.get('generation')}, this run read {expected})")
        sys.exit(CHANGED)
    with open(GENERATION + ".new", "w") as handle:
        json.dump({"generation": counted.get("generation", 0) + 1, "label": label, "since": now}, handle)
    os.rename(GENERATION + ".new", GENERATION)
    mine = {**holder(), "label": label, "since": now}
    with open(os.path.join(path, "holder.json.new"), "w") as handle:
        json.dump(mine, handle)
    os.rename(os.path.join(path, "holder.json.new"), os.path.join(path, "holder.json"))
    print(f"taken by {describe(mine)}")
    sys.exit(0)
print(f"could not take {path}")
sys.exit(75)
