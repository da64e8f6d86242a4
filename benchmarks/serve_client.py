"""A direct client for an OpenAI-compatible vLLM server, independent of heavylift's readiness probe:
the yardstick the gate's own figures are compared with (scripts/gpu_proof.sh).

    python3 benchmarks/serve_client.py URL MODEL [--tokens 256] [--wait 900] [--started-at EPOCH]

Polls URL/health every 0.2 s (up to --wait seconds), then one 8-token completion, then a streamed,
greedy decode of --tokens tokens (ignore_eos), and prints one JSON line:
- ready_seconds: from --started-at (the server process's start, epoch seconds) to the first /health 200;
- ttft_seconds: request sent -> first token;
- decode_tokens_per_second: (tokens - 1) / (last token's arrival - first token's), counted from the
  server's usage record. It is left out (null, with ``decode_note``) when the stream came in fewer
  than half as many chunks as tokens (bunched chunks time the network, not the decode).
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def post(url: str, body: dict):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--wait", type=float, default=900)
    parser.add_argument("--started-at", type=float, default=None)
    args = parser.parse_args()
    result: dict = {"url": args.url, "tokens_asked": args.tokens}
    deadline = time.monotonic() + args.wait
    while not healthy(args.url):
        if time.monotonic() > deadline:
            result["error"] = f"no /health 200 within {args.wait} s"
            print(json.dumps(result))
            raise SystemExit(1)
        time.sleep(0.2)
    result["healthy_at"] = time.time()
    if args.started_at:
        result["ready_seconds"] = round(result["healthy_at"] - args.started_at, 2)
    sent = time.monotonic()
    with post(args.url + "/v1/completions", {"model": args.model, "prompt": "The capital of France is",
                                              "max_tokens": 8, "temperature": 0}) as answer:
        json.load(answer)
    result["completion_seconds"] = round(time.monotonic() - sent, 3)
    body = {"model": args.model, "prompt": "The capital of France is", "max_tokens": args.tokens, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    sent = time.monotonic()
    first = last = None
    chunks, tokens = 0, None
    with post(args.url + "/v1/completions", body) as answer:
        for raw in answer:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if any(c.get("text") for c in event.get("choices", [])):
                last = time.monotonic()
                first = first or last
                chunks += 1
    result.update({"ttft_seconds": round(first - sent, 4) if first else None, "decode_tokens": tokens, "chunks": chunks,
                   "decode_tokens_per_second": None})
    if first and last and tokens and tokens > 1 and chunks * 2 >= tokens and last > first:
        result["decode_tokens_per_second"] = round((tokens - 1) / (last - first), 1)
    else:
        result["decode_note"] = f"{chunks} chunks for {tokens} tokens: not a decode timing"
    result["done_at"] = time.time()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
