"""Replicas that follow traffic (issue 44), measured with real engines: llama.cpp's own HTTP server (PyPI's
xllamacpp, CPU, one thread each) serving the tests' tiny model through Tessera's gateway, on this machine
described as `small` with three GPUs (nothing runs on them: they are where replicas are placed and held).
Each way below is a fresh Tessera of its own, run one after another in the same run, against the same seeded
load:

1. A bursty load: requests at BASE_RATE a second, with bursts of BURST_RATE a second for BURST_S seconds
   at seeded times; every prompt its own (PROMPT_CHARS characters, so each costs the engine its prompt's
   reading, about 0.1 s here, and nothing is cached). The model deployed three ways: fixed at one replica,
   fixed at three (the most), and autoscaled between one and three (up after 2 s above target, down after
   10 s within one fewer). Reported: time to first token p50/p95, requests failed, and replica-seconds (the
   replicas placed, sampled every half second, over the load's time).
2. A shared-prefix load: requests at PREFIX_RATE a second, each beginning with one of PREFIXES system
   prompts (SYSTEM_CHARS characters each) and then its own user's question; the model fixed at three
   replicas of two slots each, whose prompt cache holds about four of those prompts (`-cram 8`, 8 MiB of
   llama.cpp's host prompt cache beside its slots: a GPU's KV cache bounds what a real engine keeps), the
   gateway routing by prompt prefix, then by least busy alone (`--gateway-routing least-busy`). Reported:
   time to first token p50/p95, and the requests each replica answered (Tessera's own count,
   `tessera_engine_window_requests`).

    ./scripts/bench-autoscale [SECONDS]     (120 of load for each way of part 1, half that for part 2)

AUTOSCALE_SEED picks another load (1 unless set); AUTOSCALE_PARTS=1 or 2 runs one part;
AUTOSCALE_WAYS="fixed at 3,autoscaled 1 to 3" runs those ways of part 1 only; AUTOSCALE_ROUNDS=N runs
part 1's ways N times, one after another, and reports each round's ratios and their median (one round's
ratio moves by more than the targets' margin on two shared cores); AUTOSCALE_LOG=FILE writes
every request (way, second sent, time to first token, replicas placed and serving then) and, every half
second, each engine's requests sent and in flight (from /metrics) as JSON lines.
"""
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, "target", "debug", "tessera")
LLAMA = os.path.join(ROOT, "server", "tests", "llama")
PYTHON = sys.executable
PASSWORD = "a long benchmark password"

SEED = int(os.environ.get("AUTOSCALE_SEED", "1"))
LOG = os.environ.get("AUTOSCALE_LOG")
ROUNDS = int(os.environ.get("AUTOSCALE_ROUNDS", "1"))
SECONDS = int(sys.argv[1]) if len(sys.argv) > 1 else 120
BASE_RATE, BURST_RATE, BURST_S, PROMPT_CHARS = 1.0, 10.0, 15, 2000
PREFIXES, SYSTEM_CHARS, PREFIX_RATE = 12, 3000, 4.0

INVENTORY = """
[[machine]]
name = "small"
cpu_cores = 2
memory_gb = 24
""" + "".join(f'[[machine.gpu]]\nindex = {i}\nmodel = "NVIDIA L4"\nmemory_gb = 24\n' for i in range(3))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def quantile(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Tessera:
    """A server of its own, on a fresh database, whose `llama-server` is llama.cpp's own (xllamacpp)."""

    def __init__(self, weights, routing="prefix"):
        self.work = tempfile.mkdtemp(prefix="bench-autoscale-")
        data = os.path.join(self.work, "data")
        os.makedirs(data)
        bin_dir = os.path.join(self.work, "bin")
        os.makedirs(bin_dir)
        server = os.path.join(bin_dir, "llama-server")
        with open(server, "w") as f:
            f.write(f'#!/bin/sh\nexec {PYTHON} {LLAMA}/serve.py "$@"\n')
        os.chmod(server, 0o755)
        inventory = os.path.join(self.work, "small.toml")
        with open(inventory, "w") as f:
            f.write(INVENTORY)
        subprocess.run([BINARY, "--data-dir", data, "user", "add", "bench", "--role", "admin"],
                       input=PASSWORD + "\n", text=True, check=True, capture_output=True)
        self.token = subprocess.run([BINARY, "--data-dir", data, "token", "add", "bench", "--user", "bench"],
                                    text=True, check=True, capture_output=True).stdout.strip()
        self.port = free_port()
        env = dict(os.environ, RUST_LOG="warn", TESSERA_GATEWAY_ROUTING=routing,
                   PATH=f"{bin_dir}:{os.environ.get('PATH', '')}")
        self.log = open(os.path.join(self.work, "tessera.log"), "w")
        self.process = subprocess.Popen(
            [BINARY, "--inventory", inventory, "--here", "small", "--listen", f"127.0.0.1:{self.port}",
             "--data-dir", data, "--latency-window-s", "3600"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(300):
            try:
                if self.call("GET", "/api/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            raise SystemExit(f"Tessera did not start; see {self.log.name}")
        self.weights = weights

    def call(self, method, path, body=None, timeout=30):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        connection.request(method, path, json.dumps(body) if body is not None else None, headers)
        answer = connection.getresponse()
        data = answer.read()
        connection.close()
        return answer.status, json.loads(data) if data else None

    def deploy(self, args, replicas):
        status, added = self.call("POST", "/api/models", {
            "name": "tiny", "engine": "llamacpp", "default_share_percent": 1,
            "model_path": self.weights, "args": args})
        assert status == 201, added
        status, deployed = self.call("POST", "/api/deployments", {
            "model": "tiny", "gpus": ["small:0", "small:1", "small:2"], "share": 1, "replicas": replicas})
        assert status == 201, deployed
        self.wait(lambda: self.healthy() >= replicas["min"], f"{replicas['min']} replicas serving")

    def healthy(self):
        _, engines = self.call("GET", "/api/engines")
        return sum(1 for e in engines if e.get("model") == "tiny" and e["state"] == "healthy")

    def running(self):
        _, model = self.call("GET", "/api/models/tiny")
        return model["deployed"]["replicas"]["running"]

    def requests_per_engine(self):
        """The requests each of the model's engines answered, as Tessera's /metrics counts them."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {self.token}"})
        text = connection.getresponse().read().decode()
        connection.close()
        return sorted(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
                      if line.startswith("tessera_engine_window_requests{") and 'model="tiny"' in line)

    def per_engine(self):
        """Each of the model's engines: the requests sent it (Tessera's window) and those in flight now."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {self.token}"})
        text = connection.getresponse().read().decode()
        connection.close()
        engines = {}
        for line in text.splitlines():
            # The window's series name the model; the engines' own, the model they run as `worker`.
            for name, label, at in [("tessera_engine_window_requests{", 'model="tiny"', 0),
                                    ("tessera_engine_requests_in_flight{", 'worker="tiny"', 1)]:
                if line.startswith(name) and label in line:
                    engine = line.split('engine="', 1)[1].split('"', 1)[0]
                    engines.setdefault(engine, [0, 0])[at] = int(float(line.rsplit(" ", 1)[1]))
        return engines

    def wait(self, check, what, patience=60):
        start = time.monotonic()
        while not check():
            if time.monotonic() - start > patience:
                raise SystemExit(f"waited {patience} s for {what}; see {self.log.name}")
            time.sleep(0.1)

    def stop(self):
        # SIGINT: the server stops its engines with it.
        self.process.send_signal(2)
        self.process.wait(timeout=120)
        self.log.close()


def letters(rng, n):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(n))


def bursty(seed, seconds):
    """(second, messages) of every request: a Poisson base with bursts at seeded times, every prompt its own."""
    rng = random.Random(seed)
    bursts, t = [], rng.uniform(5, 15)
    while t + BURST_S < seconds:
        bursts.append(t)
        t += BURST_S + rng.uniform(25, 45)
    events, t = [], 0.0
    while t < seconds:
        in_burst = any(b <= t < b + BURST_S for b in bursts)
        t += rng.expovariate(BURST_RATE if in_burst else BASE_RATE)
        # The request's own words first: no two share a prefix, so none is read from a cache.
        messages = [{"role": "user", "content": f"{len(events)} {letters(rng, PROMPT_CHARS)}"}]
        events.append((t, messages))
    return events, bursts


def prefixed(seed, seconds):
    """(second, messages) of every request: one of a few long system prompts, then the user's own question."""
    rng = random.Random(seed)
    systems = [f"You are assistant {n}. " + letters(rng, SYSTEM_CHARS) for n in range(PREFIXES)]
    events, t = [], 0.0
    while t < seconds:
        t += rng.expovariate(PREFIX_RATE)
        messages = [{"role": "system", "content": rng.choice(systems)},
                    {"role": "user", "content": f"question {len(events)}: {letters(rng, 40)}"}]
        events.append((t, messages))
    return events


def ask(tessera, at, messages, results, lock):
    body = json.dumps({"model": "tiny", "stream": True, "max_tokens": 8, "messages": messages})
    sent = time.monotonic()
    ttft, why = None, None
    try:
        connection = http.client.HTTPConnection("127.0.0.1", tessera.port, timeout=120)
        connection.request("POST", "/v1/chat/completions", body,
                           {"Authorization": f"Bearer {tessera.token}", "Content-Type": "application/json"})
        answer = connection.getresponse()
        if answer.status == 200:
            # llama.cpp sends its first chunk with its first token (a random model's may be its end).
            for line in answer:
                if ttft is None and line.startswith(b"data: "):
                    ttft = time.monotonic() - sent
            if ttft is None:
                why = "no token"
        else:
            why = f"{answer.status}: {answer.read().decode(errors='replace')[:200]}"
        connection.close()
    except OSError as error:
        why = str(error)
    with lock:
        results.append({"at": at, "ttft": ttft, "why": why})


def replay(tessera, events):
    """Sends every request at its second, each on a thread of its own; samples the replicas placed and
    serving every half second meanwhile (and, for the log, each engine's requests). The results, the
    replica-seconds over the load's time, and what was sampled."""
    results, lock, threads = [], threading.Lock(), []
    samples, engines, done = [], [], threading.Event()
    start = time.monotonic()

    def sample():
        while not done.is_set():
            at = time.monotonic() - start
            samples.append((at, tessera.running(), tessera.healthy()))
            # Where requests went, for the log alone: it reads the whole of /metrics each time.
            if LOG:
                engines.append((at, tessera.per_engine()))
            done.wait(0.5)

    sampler = threading.Thread(target=sample)
    sampler.start()
    for at, messages in events:
        delay = start + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        thread = threading.Thread(target=ask, args=(tessera, at, messages, results, lock))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - start
    done.set()
    sampler.join()
    replica_seconds = sum(n for _, n, _ in samples) / max(len(samples), 1) * elapsed
    return results, replica_seconds, (samples, engines)


def log(way, results, sampled):
    """Each request's second, time to first token, and the replicas placed and serving at the sample before
    it was sent; then each sample of the engines' requests."""
    if not LOG:
        return
    replicas, engines = sampled
    with open(LOG, "a") as f:
        for r in sorted(results, key=lambda r: r["at"]):
            placed, serving = next(((n, h) for t, n, h in reversed(replicas) if t <= r["at"]), (None, None))
            f.write(json.dumps({"way": way, "at": round(r["at"], 3), "ttft": r["ttft"] and round(r["ttft"], 3),
                                "placed": placed, "serving": serving}) + "\n")
        for at, each in engines:
            f.write(json.dumps({"way": way, "sampled": round(at, 3), "engines": each}) + "\n")


def summary(results, replica_seconds=None):
    answered = [r["ttft"] for r in results if r["ttft"] is not None]
    out = {
        "requests": len(results),
        "failed": len(results) - len(answered),
        "ttft_p50_s": round(quantile(answered, 0.5), 3),
        "ttft_p95_s": round(quantile(answered, 0.95), 3),
    }
    if replica_seconds is not None:
        out["replica_seconds"] = round(replica_seconds)
    failures = [r["why"] for r in results if r["ttft"] is None][:3]
    if failures:
        out["first_failures"] = failures
    return out


def part_one(weights):
    events, bursts = bursty(SEED, SECONDS)
    print(f"bursty load {SEED}: {len(events)} requests over {SECONDS} s, bursts at "
          f"{', '.join(f'{b:.0f}' for b in bursts)} s", flush=True)
    ways = [
        ("fixed at 1", {"min": 1, "max": 1}),
        ("fixed at 3", {"min": 3, "max": 3}),
        ("autoscaled 1 to 3", {"min": 1, "max": 3, "up_s": 2, "down_s": 10}),
    ]
    if "AUTOSCALE_WAYS" in os.environ:
        ways = [w for w in ways if w[0] in os.environ["AUTOSCALE_WAYS"].split(",")]
    rounds, ratios = [], []
    for n in range(ROUNDS):
        report = {}
        # Fixed at one replica is the context, not the comparison: once.
        for way, replicas in [w for w in ways if n == 0 or w[0] != "fixed at 1"]:
            tessera = Tessera(weights)
            try:
                tessera.deploy(["-np", "1"], replicas)
                results, replica_seconds, sampled = replay(tessera, events)
                log(f"{way} #{n + 1}", results, sampled)
            finally:
                tessera.stop()
            report[way] = summary(results, replica_seconds)
            print(f"round {n + 1}: {way} {json.dumps(report[way])}", flush=True)
        rounds.append(report)
        if "autoscaled 1 to 3" in report and "fixed at 3" in report:
            auto, most = report["autoscaled 1 to 3"], report["fixed at 3"]
            ratios.append((auto["ttft_p95_s"] / most["ttft_p95_s"], auto["replica_seconds"] / most["replica_seconds"]))
            print(f"round {n + 1}: autoscaled against fixed at 3: p95 {ratios[-1][0]:.2f}x, "
                  f"replica-seconds {ratios[-1][1]:.0%}", flush=True)
    if len(ratios) > 1:
        print(f"median of {len(ratios)} rounds: p95 {median([r[0] for r in ratios]):.2f}x, "
              f"replica-seconds {median([r[1] for r in ratios]):.0%}", flush=True)
    return rounds


def part_two(weights):
    events = prefixed(SEED, SECONDS // 2)
    print(f"shared-prefix load {SEED}: {len(events)} requests over {SECONDS // 2} s, {PREFIXES} system "
          f"prompts of {SYSTEM_CHARS} characters", flush=True)
    report = {}
    for routing in ["prefix", "least-busy"]:
        tessera = Tessera(weights, routing)
        try:
            tessera.deploy(["-np", "2", "-cram", "12"], {"min": 3, "max": 3})
            results, _, sampled = replay(tessera, events)
            log(routing, results, sampled)
            per_replica = tessera.requests_per_engine()
        finally:
            tessera.stop()
        report[routing] = summary(results)
        report[routing]["per_replica"] = per_replica
        print(routing, json.dumps(report[routing]), flush=True)
    prefix, least = report["prefix"], report["least-busy"]
    spread = prefix["per_replica"]
    print(f"prefix routing against least busy: p50 {least['ttft_p50_s'] / prefix['ttft_p50_s']:.1f}x lower, "
          f"busiest replica {spread[-1] / max(spread[0], 1):.2f}x the least busy's requests", flush=True)
    return report


def main():
    weights_dir = tempfile.mkdtemp(prefix="bench-autoscale-model-")
    weights = os.path.join(weights_dir, "tiny.gguf")
    subprocess.run([PYTHON, os.path.join(LLAMA, "tiny_model.py"), weights, "8192"], check=True)
    parts = os.environ.get("AUTOSCALE_PARTS", "1,2").split(",")
    report = {}
    if "1" in parts:
        report["bursty"] = part_one(weights)
    if "2" in parts:
        report["shared prefix"] = part_two(weights)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
