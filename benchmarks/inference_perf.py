"""inference-perf (kubernetes-sigs/inference-perf, PyPI) against a fresh `serve`: what a
real benchmark tool that nobody here wrote measures, next to what the lab modelled.

    python benchmarks/inference_perf.py --venv /path/to/venv [--concurrency 24]
        [--requests 480] [--tokens 200] [--workers 1] [--pin]

inference-perf needs Python >= 3.12, so it lives in its own venv outside the repository
(`python3.12 -m venv V && V/bin/pip install inference-perf tokenizers`); `--venv V` names
it. Nothing is downloaded at run time: the tokenizer it needs is a small byte-level BPE
trained here with `tokenizers`' trainer on a corpus made here (the lab's placeholder token
" token" is one of its tokens, so the client counts the tokens the lab sends), and the
Hugging Face libraries run offline.

Prints inference-perf's TTFT, TPOT, ITL and e2e (mean, p50, p99) next to the lab's
modelled values over the same run (from the API port's vllm:* histograms: their exact
means, and p50 / p99 by histogram_quantile), and the CPU each process used: inference-perf
shares the machine's cores with the gateway and the engine it measures; `--pin` keeps them
apart (the lab, engine and gateway, on CPU 0; inference-perf on CPU 1).

Also printed: tokens per client read (from inference-perf's per-request inter-token
gaps: a gap under READ_GAP is a token that came in the same read as the one before it,
i.e. grouped by the lab or read late by the client), and the stream cadence over the run
(the lab's inference_lab_stream_cadence_* histograms: the update interval and the
gateway's mean lateness in each 50 ms control period).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

READ_GAP = 0.0005  # s: tokens closer than this came in one read (a step takes >= ~1.4 ms)

TRAIN = textwrap.dedent("""
    import json, os, random, sys
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    rng = random.Random(0)
    syllables = ["ka", "to", "mi", "ra", "ne", "su", "lo", "pe", "di", "gu", "an", "el"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    corpus = [" ".join(rng.choice(words) for _ in range(30)) + "." for _ in range(3000)]
    corpus += [" token" * 50] * 200  # the lab's placeholder text: one token
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=2000, special_tokens=["[UNK]", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
               "model_max_length": 131072}, open(os.path.join(out, "tokenizer_config.json"), "w"))
    assert len(tok.encode(" token" * 10).ids) == 10
""")

CONFIG = """\
load:
  type: concurrent
  stages:
    - num_requests: {requests}
      concurrency_level: {concurrency}
  num_workers: {workers}
api:
  type: completion
  streaming: true
server:
  type: vllm
  model_name: gpt-oss-20b
  base_url: {base}
  ignore_eos: true
tokenizer:
  pretrained_model_name_or_path: {tokenizer}
data:
  type: random
  input_distribution: {{min: {prompt}, max: {prompt}, mean: {prompt}, std_dev: 0, total_count: {requests}}}
  output_distribution: {{min: {tokens}, max: {tokens}, mean: {tokens}, std_dev: 0, total_count: {requests}}}
report:
  request_lifecycle:
    summary: true
    per_request: true
    per_request_fields: {{request: false, response: false, info: false, computed_metrics: true}}
storage:
  local_storage:
    path: {reports}
"""

MODELLED = {  # inference-perf's name -> the lab's series
    "time_to_first_token": "vllm:time_to_first_token_seconds",
    "time_per_output_token": "vllm:request_time_per_output_token_seconds",
    "inter_token_latency": "vllm:inter_token_latency_seconds",
    "request_latency": "vllm:e2e_request_latency_seconds",
}


def descendants(pid: int) -> list[int]:
    """pid and every process below it (inference-perf forks its workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` on `cpus`."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tasks:
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass


def cadence(before: str, after: str) -> None:
    """The stream cadence's control periods over the run: the interval each period left,
    and the gateway's mean lateness over each (from the lab's histograms)."""
    names = {"interval": "inference_lab_stream_cadence_interval_seconds",
             "relay lag": "inference_lab_stream_cadence_relay_lag_seconds"}
    for what, series in names.items():
        try:
            buckets, count, _ = C.histogram_delta(C.histogram(before, series), C.histogram(after, series))
        except (KeyError, IndexError):
            print(f"{series}: not exported")
            continue
        if not count:
            print(f"cadence {what}: no control period")
            continue
        shares, prev = [], 0.0
        for le, c in buckets:
            if c > prev:
                shares.append(f"<={le * 1e3:g} ms {100 * (c - prev) / count:.0f} %")
            prev = c
        p50 = C.histogram_quantile(buckets, 0.5)[0]
        p90 = C.histogram_quantile(buckets, 0.9)[0]
        print(f"cadence {what} over {count:.0f} periods: p50 {p50 * 1e3:.2f} ms, p90 "
              f"{p90 * 1e3:.2f} ms; " + ", ".join(shares))


def metrics(base: str) -> str:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        return resp.read().decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", required=True, type=Path, help="the venv inference-perf is in")
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--requests", type=int, default=480)
    ap.add_argument("--tokens", type=int, default=200, help="output tokens per request")
    ap.add_argument("--prompt", type=int, default=100, help="prompt tokens per request")
    ap.add_argument("--workers", type=int, default=1, help="inference-perf worker processes")
    ap.add_argument("--pin", action="store_true",
                    help="the lab on CPU 0, inference-perf on CPU 1 (taskset)")
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                    help="an argument for `serve` (repeat: --serve-arg=--max-update-rate "
                    "--serve-arg=10000)")
    args = ap.parse_args()
    binary = args.venv / "bin" / "inference-perf"
    python = args.venv / "bin" / "python"
    print(C.machine())
    with tempfile.TemporaryDirectory() as work:
        tokenizer = Path(work) / "tokenizer"
        subprocess.run([str(python), "-c", TRAIN, str(tokenizer)], check=True, timeout=300)
        with C.serve(*args.serve_arg) as served:
            if args.pin:
                for pid in descendants(served.proc.pid):
                    pin(pid, {0})
            config = Path(work) / "config.yml"
            reports = Path(work) / "reports"
            config.write_text(CONFIG.format(
                requests=args.requests, concurrency=args.concurrency, workers=args.workers,
                base=served.base, tokenizer=tokenizer, prompt=args.prompt, tokens=args.tokens,
                reports=reports))
            C.print_load("inference-perf")
            before = metrics(served.base)
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
            log = open(Path(work) / "inference-perf.log", "w")
            pinned = ["taskset", "-c", "1"] if args.pin else []
            client = subprocess.Popen([*pinned, str(binary), "-c", str(config)], cwd=work, env=env,
                                      stdout=log, stderr=subprocess.STDOUT)
            # CPU is counted from the first token the lab generates to the last finish
            # (inference-perf spends seconds before loading its tokenizer and making
            # prompts, and after writing its reports).
            pids = {"engine": [served.engine_pid], "gateway": [served.gateway_pid]}
            start_cpu = end_cpu = None
            client_cpu = client_start = client_end = wall0 = wall = 0.0
            timeline = []  # (wall s since the first token, the update interval gauge)
            while client.poll() is None:
                client_cpu = sum(C.proc_cpu(p) for p in descendants(client.pid))
                if end_cpu is None:
                    text = metrics(served.base)
                    if start_cpu is not None:
                        timeline.append((time.monotonic() - wall0, C.counter(
                            text, "inference_lab_stream_update_interval_seconds")))
                    if start_cpu is None and C.counter(text, "vllm:generation_tokens"):
                        start_cpu, client_start, wall0 = C.cpu_snapshot(pids), client_cpu, time.monotonic()
                    elif start_cpu is not None and C.counter(text, "vllm:request_success") >= args.requests:
                        end_cpu, client_end, wall = C.cpu_snapshot(pids), client_cpu, time.monotonic() - wall0
                time.sleep(0.1)
            log.close()
            if client.returncode != 0:
                sys.exit(f"inference-perf failed:\n{(Path(work) / 'inference-perf.log').read_text()[-3000:]}")
            after = metrics(served.base)
            summary = json.loads((reports / "summary_lifecycle_metrics.json").read_text())
            per_request = json.loads((reports / "per_request_lifecycle_metrics.json").read_text())
    latency = summary["successes"]["latency"]
    print(f"\ninference-perf {args.requests} requests at concurrency {args.concurrency} "
          f"({args.workers} worker process(es)), prompt {args.prompt}, output {args.tokens} "
          f"tokens; successes {summary['successes']['count']}, failures "
          f"{summary.get('failures', {}).get('count', 0)}")
    print(f"{'metric (ms)':<24}{'client mean':>12}{'p50':>9}{'p99':>9}   {'modelled mean':>13}{'p50':>9}{'p99':>9}")
    for key, series in MODELLED.items():
        got = latency[key]
        buckets, count, total = C.histogram_delta(C.histogram(before, series), C.histogram(after, series))
        p50 = C.histogram_quantile(buckets, 0.5)[0]
        p99 = C.histogram_quantile(buckets, 0.99)[0]
        print(f"{key:<24}{got['mean'] * 1e3:>12.3f}{got['median'] * 1e3:>9.3f}{got['p99'] * 1e3:>9.3f}"
              f"   {total / count * 1e3:>13.3f}{p50 * 1e3:>9.3f}{p99 * 1e3:>9.3f}")
    tokens = reads = 0
    for entry in per_request:
        gaps = (entry.get("computed_metrics") or {}).get("inter_token_latencies") or []
        tokens += len(gaps) + 1
        reads += 1 + sum(gap >= READ_GAP for gap in gaps)
    if reads:
        print(f"\ntokens per client read (gaps under {READ_GAP * 1e3:g} ms: one read): "
              f"{tokens / reads:.2f} over {len(per_request)} requests")
    e2e = latency["request_latency"]
    _, count, total = C.histogram_delta(C.histogram(before, MODELLED["request_latency"]),
                                        C.histogram(after, MODELLED["request_latency"]))
    print(f"e2e client / modelled, means: {100 * (e2e['mean'] / (total / count) - 1):+.2f} %")
    cadence(before, after)
    if timeline:  # the interval gauge, sampled every ~0.1 s: its mean over each second
        seconds = {}
        for at, value in timeline:
            seconds.setdefault(int(at), []).append(value)
        print("update interval, mean of each second (ms): " + " ".join(
            f"{1e3 * sum(v) / len(v):.1f}" for _, v in sorted(seconds.items())))
    used = {k: end_cpu[k] - start_cpu[k] for k in end_cpu}
    used["inference-perf"] = client_end - client_start
    print(f"\nCPU while requests ran ({wall:.1f} s), in cores: " + ", ".join(
        f"{k} {v / wall:.2f}" for k, v in used.items() if k != "machine")
        + f"; whole machine {used['machine'] / wall:.2f} of {os.cpu_count()}")


if __name__ == "__main__":
    main()
