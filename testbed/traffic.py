"""Bounded client load on a fleet of vLLM servers, and what the clients saw: for a rollout under traffic.

A fixed number of streams, each sending one streamed completion after another (``pause`` seconds apart) to the hosts in turn
(round robin, every host whatever its state: the clients do not know a restart is coming), for as
long as the load runs; beside them one sampler per host asking ``/health`` every ``sample_every``
seconds. Every request ends as one of:

- ``ok``: the stream ended with vLLM's ``data: [DONE]``;
- ``refused``: no answer began: the connection was refused or reset, or the server answered with an
  error status before any token (vLLM 0.32 answers a new request with 500 "cannot schedule new futures after shutdown"
  while it drains: its tokenizer pool is shut first, vllm/v1/engine/async_llm.py AsyncLLM.shutdown);
- ``broken``: an answer began (status 200) and the stream ended without ``[DONE]``: a client lost a
  request that a server had taken. A graceful rollout has none.

The host a request went to and its start and end times are kept, so a refusal can be matched to the
time that host was out, and a request in flight when its host began to drain can be seen to have completed
(when a drain began is the server's to say: vLLM logs it; tests/test_e2e_waves.py reads it there).

    with Traffic({"host1": "http://127.0.0.1:8001", ...}, model="heavylift/tiny-llama") as load:
        ...  # roll the fleet
    report = load.report()
    print(report.describe())

Loopback and the test's own namespaces only; the standard library only.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    host: str
    started: float
    ended: float
    outcome: str  # "ok", "refused" or "broken"
    detail: str = ""
    tokens: int = 0  # completion tokens: the server's usage when it sent one, else the events with a choice


@dataclass(frozen=True)
class Outage:
    """A run of failed ``/health`` samples of one host: from the first failed one to the next good one."""

    host: str
    began: float
    ended: float  # the send time of the first good sample after it (the load's end if none came)

    @property
    def seconds(self) -> float:
        return self.ended - self.began


@dataclass
class Report:
    requests: list[Request]
    outages: list[Outage]
    samples: int
    seconds: float
    hosts: tuple[str, ...]
    max_out_at_once: int = 0

    def of(self, outcome: str) -> list[Request]:
        return [r for r in self.requests if r.outcome == outcome]

    @property
    def longest_outage(self) -> Outage | None:
        return max(self.outages, key=lambda o: o.seconds, default=None)

    def refused_outside_outages(self, slack: float) -> list[Request]:
        """Refusals by a host that was not out (by ``/health``) within ``slack`` seconds of the request."""
        return [r for r in self.of("refused")
                if not any(o.host == r.host and o.began - slack <= r.started <= o.ended + slack for o in self.outages)]

    def describe(self) -> str:
        longest = self.longest_outage
        longest_text = f"{longest.seconds:.1f} s ({longest.host})" if longest else "none"
        per_host = ", ".join(
            f"{host}: {sum(1 for r in self.requests if r.host == host and r.outcome == 'ok')} ok"
            f"/{sum(1 for r in self.requests if r.host == host)}" for host in self.hosts)
        return (f"{len(self.requests)} requests in {self.seconds:.0f} s: {len(self.of('ok'))} ok, "
                f"{len(self.of('refused'))} refused, {len(self.of('broken'))} broken ({per_host}); "
                f"hosts out at once at most {self.max_out_at_once}; longest out {longest_text}; "
                f"{self.samples} health samples")


class Traffic:
    """``streams`` clients sending streamed completions round robin to ``endpoints`` while the context is open."""

    def __init__(self, endpoints: dict[str, str], model: str, streams: int = 3, max_tokens: int = 32,
                 pause: float = 0.0, sample_every: float = 0.1, probe_timeout: float = 3.0,
                 request_timeout: float = 120.0):
        self.endpoints = dict(endpoints)
        self.model = model
        self.streams = streams
        self.max_tokens = max_tokens
        self.pause = pause  # each stream's wait between its requests: the load's bound besides `streams`
        self.sample_every = sample_every
        self.probe_timeout = probe_timeout
        self.request_timeout = request_timeout
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._requests: list[Request] = []
        self._samples: dict[str, list[tuple[float, bool]]] = {name: [] for name in endpoints}
        self._threads: list[threading.Thread] = []
        self._started = self._ended = 0.0

    # the load

    def __enter__(self) -> Traffic:
        self._started = time.monotonic()
        names = list(self.endpoints)
        for name in names:
            self._threads.append(threading.Thread(target=self._sample, args=(name,), daemon=True))
        for index in range(self.streams):
            self._threads.append(threading.Thread(target=self._stream, args=(names, index), daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def stop(self) -> None:
        """No new request; the ones in flight run to their end (bounded by request_timeout)."""
        if self._stop.is_set():
            return
        self._stop.set()
        for thread in self._threads:
            thread.join(self.request_timeout + 10)
        self._ended = time.monotonic()

    def _stream(self, names: list[str], index: int) -> None:
        turn = index
        while not self._stop.is_set():
            name = names[turn % len(names)]
            turn += 1
            request = self.complete(name)
            with self._lock:
                self._requests.append(request)
            # a refusal comes back at once: never spin on a host that is down
            self._stop.wait(max(self.pause, 0.05 if request.outcome == "refused" else 0.0))

    def complete(self, name: str, max_tokens: int | None = None) -> Request:
        url = urllib.parse.urlsplit(self.endpoints[name])
        # the server's own count of the tokens it sent (usage): vLLM merges tokens into one event when its API
        # server falls behind, so the events are fewer than the tokens on a busy host
        body = json.dumps({"model": self.model, "prompt": "Hello", "max_tokens": max_tokens or self.max_tokens,
                           "stream": True, "ignore_eos": True, "temperature": 0,
                           "stream_options": {"include_usage": True}})
        started = time.monotonic()
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=self.request_timeout)
        tokens, began = 0, False
        try:
            connection.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            answer = connection.getresponse()
            if answer.status != 200:
                text = answer.read(300).decode(errors="replace")
                return Request(name, started, time.monotonic(), "refused", f"HTTP {answer.status}: {text}")
            began = True
            while True:
                line = answer.readline()
                if not line:
                    return Request(name, started, time.monotonic(), "broken", "the stream ended without [DONE]", tokens)
                line = line.strip()
                if line == b"data: [DONE]":
                    return Request(name, started, time.monotonic(), "ok", tokens=tokens)
                if line.startswith(b"data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        return Request(name, started, time.monotonic(), "broken", f"error event: {event['error']}", tokens)
                    if event.get("usage"):
                        tokens = event["usage"].get("completion_tokens", tokens)
                    elif event.get("choices"):
                        tokens += 1  # until the usage comes: an event per token at least
        except (OSError, http.client.HTTPException, ValueError) as error:
            outcome = "broken" if began else "refused"
            return Request(name, started, time.monotonic(), outcome, f"{type(error).__name__}: {error}", tokens)
        finally:
            connection.close()

    def _sample(self, name: str) -> None:
        url = urllib.parse.urlsplit(self.endpoints[name])
        while not self._stop.is_set():
            sent = time.monotonic()
            healthy = False
            connection = http.client.HTTPConnection(url.hostname, url.port, timeout=self.probe_timeout)
            try:
                connection.request("GET", "/health")
                healthy = connection.getresponse().status == 200
            except (OSError, http.client.HTTPException):
                healthy = False
            finally:
                connection.close()
            with self._lock:
                self._samples[name].append((sent, healthy))
            self._stop.wait(max(0.0, self.sample_every - (time.monotonic() - sent)))

    def requests_so_far(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def samples_of(self, name: str) -> list[bool]:
        with self._lock:
            return [healthy for _, healthy in self._samples[name]]

    # what the clients saw

    def report(self) -> Report:
        self.stop()
        with self._lock:
            requests = sorted(self._requests, key=lambda r: r.started)
            samples = {name: list(found) for name, found in self._samples.items()}
        outages = []
        for name, found in samples.items():
            began = None
            for sent, healthy in found:
                if not healthy and began is None:
                    began = sent
                elif healthy and began is not None:
                    outages.append(Outage(name, began, sent))
                    began = None
            if began is not None:
                outages.append(Outage(name, began, self._ended))
        report = Report(requests=requests, outages=sorted(outages, key=lambda o: o.began),
                        samples=sum(len(found) for found in samples.values()),
                        seconds=self._ended - self._started, hosts=tuple(self.endpoints))
        report.max_out_at_once = max_overlap(report.outages)
        return report


def max_overlap(outages: list[Outage]) -> int:
    """The most outages open at one instant (an outage that ends as another begins does not overlap it)."""
    events = sorted([(o.began, 1) for o in outages] + [(o.ended, -1) for o in outages], key=lambda e: (e[0], e[1]))
    most = current = 0
    for _, step in events:
        current += step
        most = max(most, current)
    return most
