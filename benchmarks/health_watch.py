"""Watch a vLLM server's /health from outside, every --every seconds, and write each change (up <-> down) as
one JSON line: the yardstick of a restart's downtime (scripts/gpu_proof.sh change).

    python3 benchmarks/health_watch.py URL OUT.jsonl [--every 0.1]

Each line: {"at": epoch seconds of the first poll in the new state, "up": bool, "last_other": epoch seconds
of the last poll in the state before}. "Stops answering" is a down line's last_other (its last 200), "answers
again" an up line's at. Runs until killed.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as answer:
            return answer.status == 200
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("--every", type=float, default=0.1)
    args = parser.parse_args()
    state, last = None, None
    with open(args.out, "a") as out:
        while True:
            now = time.time()
            up = healthy(args.url)
            if up != state:
                out.write(json.dumps({"at": round(now, 3), "up": up, "last_other": last and round(last, 3)}) + "\n")
                out.flush()
                state = up
            last = now
            time.sleep(max(0.0, args.every - (time.time() - now)))


if __name__ == "__main__":
    main()
