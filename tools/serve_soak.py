"""A long run of `specexport serve` over HTTP: many requests of every kind (chat and completions, streamed and
not, greedy and sampled, stop strings, speculative modes, clients that leave mid-stream, bad requests), with the
server process's resident memory and open file descriptors read from /proc every `--every` requests.

    .venv/bin/python tools/serve_soak.py --bundle bundles/smollm2 --requests 1000 --out reports/serve-soak.json

It starts the server itself on a free port of 127.0.0.1, sends only there, one request at a time, bounded by
`--requests` and `--max-seconds`, then stops it with SIGTERM (which must exit 0). It passes when, after the first
`--every` requests (warm-up), the server's memory grows by at most `--max-growth`, its open fds stay within one of
where they were (the client's keep-alive connection may be open or not), every request got the status it should,
and the server exited 0. Linux only (/proc)."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

PROMPTS = ["Explain how a hash table works.", "Write a haiku about the sea.", "What is 17 times 23?",
           "List three uses of copper.", "Why is the sky blue?", "Write a Python function that reverses a string."]

# (endpoint, body fields, expected status, how the client reads it) in turn
KINDS = [
    ("chat", {}, 200, "whole"),
    ("chat", {"stream_options": {"include_usage": True}}, 200, "stream"),
    ("completions", {}, 200, "whole"),
    ("completions", {}, 200, "stream"),
    ("chat", {"temperature": 0.8, "top_p": 0.9}, 200, "whole"),
    ("chat", {"stop": ["\n\n", "."]}, 200, "stream"),
    ("chat", {"specexport": {"mode": "ar"}}, 200, "whole"),
    ("chat", {"specexport": {"mode": "lookup"}}, 200, "stream"),
    ("chat", {}, 200, "leave"),  # the client goes after the first chunk
    ("chat", {"specexport": {"mode": "warp"}}, 400, "whole"),  # refused before it runs
    ("chat", {"n": 3}, 400, "whole"),
]


def proc_status(pid: int) -> tuple[float, int]:
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))
    return rss, len(list(Path(f"/proc/{pid}/fd").iterdir()))


def start_server(bundle: str, threads: int | None) -> tuple[subprocess.Popen, str]:
    exe = str(Path(sys.executable).with_name("specexport"))
    args = [exe, "serve", "--bundle", bundle, "--port", "0", "--log-level", "warning"]
    if threads:
        args += ["--threads", str(threads)]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if " on http://" in line:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # its log must not fill the pipe
            return proc, line.split(" on ")[1].split()[0].removesuffix("/v1")
    raise SystemExit(f"the server did not start (exit {proc.wait()})")


def one_request(client: httpx.Client, i: int, max_tokens: int) -> tuple[bool, int]:
    """Sends request `i`; returns (it got the expected status, completion tokens)."""
    endpoint, fields, status, read = KINDS[i % len(KINDS)]
    prompt = PROMPTS[i % len(PROMPTS)]
    body = {"max_tokens": max_tokens, "seed": i, **fields, **({"stream": True} if read != "whole" else {})}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    path = f"/v1/{'chat/completions' if endpoint == 'chat' else 'completions'}"
    if read == "whole":
        r = client.post(path, json=body)
        tokens = r.json().get("usage", {}).get("completion_tokens", 0) if r.status_code == 200 else 0
        return r.status_code == status, tokens
    with client.stream("POST", path, json=body) as r:
        if r.status_code != status:
            return False, 0
        if read == "leave":
            next(line for line in r.iter_lines() if line.startswith("data: "))
            return True, 0  # leaving the block closes the connection mid-stream
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    return events[-1] == "data: [DONE]", 0


def soak(bundle: str, requests: int, every: int, max_tokens: int, max_seconds: float,
         threads: int | None) -> dict:
    proc, url = start_server(bundle, threads)
    samples = [{"requests": 0, "rss_mb": round(proc_status(proc.pid)[0], 1), "open_fds": proc_status(proc.pid)[1],
                "seconds": 0.0}]
    wrong: list[int] = []
    tokens = 0
    t0 = time.perf_counter()
    done = 0
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            for i in range(1, requests + 1):
                ok, n = one_request(client, i, max_tokens)
                tokens += n
                done = i
                if not ok:
                    wrong.append(i)
                if i % every == 0:
                    rss, fds = proc_status(proc.pid)
                    samples.append({"requests": i, "rss_mb": round(rss, 1), "open_fds": fds,
                                    "seconds": round(time.perf_counter() - t0, 1)})
                    print(f"{i} requests: server RSS {rss:.1f} MB, {fds} fds", file=sys.stderr, flush=True)
                if time.perf_counter() - t0 > max_seconds:
                    break
            health = client.get("/health").json()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
    warm = samples[1] if len(samples) > 1 else samples[0]
    return {"bundle": bundle, "requests": done, "every": every, "max_tokens": max_tokens,
            "seconds": round(time.perf_counter() - t0, 1), "completion_tokens_of_whole_responses": tokens,
            "kinds": [{"endpoint": e, "fields": f, "status": s, "read": r} for e, f, s, r in KINDS],
            "wrong_status": wrong, "health": health, "exit_code": code, "samples": samples,
            "rss_growth_after_warmup": round(samples[-1]["rss_mb"] / warm["rss_mb"] - 1, 4),
            "fds_after_warmup": [s["open_fds"] for s in samples[1:]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-seconds", type=float, default=3600.0, help="Stop sending after this long.")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-growth", type=float, default=0.05)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    report = soak(args.bundle, args.requests, args.every, args.max_tokens, args.max_seconds, args.threads)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    fds = report["fds_after_warmup"]
    ok = (report["rss_growth_after_warmup"] <= args.max_growth and (max(fds) - min(fds) <= 1 if fds else True)
          and not report["wrong_status"] and report["exit_code"] == 0)
    print(json.dumps({k: report[k] for k in ("requests", "seconds", "rss_growth_after_warmup", "fds_after_warmup",
                                             "wrong_status", "exit_code")}))
    print(f"serve soak {'passed' if ok else 'FAILED'}: {report['requests']} requests, memory"
          f" {report['rss_growth_after_warmup']:+.1%} after warm-up (at most {args.max_growth:.0%}), open fds"
          f" {sorted(set(fds))}, {len(report['wrong_status'])} wrong statuses, exit {report['exit_code']}",
          file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
