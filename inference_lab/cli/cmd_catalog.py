"""`inference-lab catalog`: list the hardware and model presets, or show one with its
derived figures (parameters, weight bytes, KV bytes per token, layer kinds)."""

from __future__ import annotations

import argparse

from inference_lab.cli import UsageError
from inference_lab.cli.catalog_flags import add_catalog_argument, build_catalog

HELP = """\
List the bundled presets (and those of --catalog directories): every model with its total
and active parameters, KV bytes per token on one GPU and layer kinds; every hardware
preset with its peaks. `catalog show NAME` prints one preset with its derived figures.

examples:
  inference-lab catalog
  inference-lab catalog show deepseek-v3
  inference-lab catalog --catalog ~/my-catalog show my-model
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("catalog", help="list the hardware and model presets, or show one",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_catalog_argument(p)
    p.add_argument("action", nargs="?", choices=("list", "show"), default="list",
                   help="list (default) or show NAME")
    p.add_argument("name", nargs="?", help="the preset to show (a model or a hardware name)")
    p.set_defaults(func=run)


def _e(x: float) -> str:
    return f"{x / 1e9:,.2f}e9"


def model_row(model) -> dict:
    from inference_lab.engine.sim import layers

    total = sum(s.resident_params for s in model.weight_streams)
    active = sum(s.active_params for s in model.weight_streams)
    kinds = sorted({c.kind for c in model.layer_classes})
    return {"name": model.name, "total_params": total, "active_params": active,
            "kv_bytes_per_token": layers.kv_bytes_per_token(model),
            "state_bytes_per_sequence": layers.fixed_bytes_per_sequence(model),
            "layers": "+".join(f"{c.count} {c.kind}" for c in model.layer_classes),
            "kinds": ",".join(kinds)}


def show_model(model, source: str) -> None:
    from inference_lab.engine.sim.catalog import weight_bytes

    row = model_row(model)
    print(f"model {model.name}  ({source})")
    print(f"  parameters: {_e(row['total_params'])} total, {_e(row['active_params'])} active per token")
    print(f"  weights: {weight_bytes(model) / 1e9:,.1f} GB; hidden {model.hidden_size}, "
          f"max_seq_len {model.max_seq_len}, attention in {model.attention_precision}")
    for s in model.weight_streams:
        routed = (f", {s.num_experts} experts, {s.top_k} per token, {s.moe_layers or model.num_layers} "
                  "MoE layers" if s.num_experts else "")
        print(f"  stream {s.precision}: active {_e(s.active_params)}, resident {_e(s.resident_params)}{routed}")
    for c in model.layer_classes:
        if c.kind == "linear":
            shape = f"state {c.state_bytes:,.0f} B per sequence"
        elif c.kind == "attention":
            shape = (f"{c.heads} heads x {c.head_dim}, {c.kv_heads} KV heads"
                     + (", K = V" if c.kv_shared else "") + (f", window {c.window}" if c.window else ""))
        else:
            shape = (f"latent {c.latent_dim} + rope {c.rope_dim}"
                     + (f", {c.heads} heads qk {c.qk_head_dim} / v {c.v_head_dim}" if c.heads else "")
                     + (f", window {c.window}" if c.window else "")
                     + (f", history every {c.history.compress_ratio}"
                        + (f" top-{c.history.index_topk}" if c.history.index_topk else "")
                        if c.history else ""))
        print(f"  layers: {c.count} {c.kind} ({shape})")
    print(f"  KV per token on one GPU: {row['kv_bytes_per_token']:,.0f} B"
          + (f"; recurrent state per sequence: {row['state_bytes_per_sequence']:,.0f} B"
             if row["state_bytes_per_sequence"] else ""))


def show_hardware(hw, source: str) -> None:
    print(f"hardware {hw.name}  ({source})")
    peaks = ", ".join(f"{p} {v:.4g}" for p, v in hw.flops.items())
    print(f"  dense FLOP/s: {peaks}")
    print(f"  HBM: {hw.hbm_bytes / 1e9:,.0f} GB at {hw.hbm_bandwidth / 1e12:.3g} TB/s")
    if hw.link_bandwidth:
        print(f"  scale-up: {hw.link_bandwidth / 1e9:,.0f} GB/s per direction, {hw.link_latency * 1e6:.0f} us, "
              + ("in-switch reduction" if hw.in_network_reduction else "ring all-reduce")
              + (f", {hw.gpus_per_node} GPUs per node" if hw.gpus_per_node else ""))
    if hw.scale_out_bandwidth:
        print(f"  scale-out: {hw.scale_out_bandwidth / 1e9:,.0f} GB/s per direction per GPU")
    if hw.memory_stores:
        print(f"  KV stores beyond HBM: {', '.join(hw.memory_stores)} (a config's [memory] "
              "tiers make host-memory and NVMe stores KV offloading's host and disk tiers)")
    if hw.calibration is not None:
        own = hw.calibration.vllm_version or "unstated"
        line = f"  calibrated timing: vLLM {own} (--timing calibrated, {hw.calibration.provenance})"
        for gen in hw.generations:
            line += f"; vLLM {gen.vllm_version} (--timing calibrated-v{gen.vllm_version})"
        print(line)
        reserves: dict[float, list[str]] = {}
        for c in (hw.calibration, *hw.generations):
            if c.memory_reserve:
                reserves.setdefault(c.memory_reserve, []).append(c.vllm_version or "unstated")
        for reserve, versions in reserves.items():
            print(f"  calibrated KV pool: {reserve / 1e9:.3g} GB per GPU kept outside the weights "
                  f"and the pool (vLLM {', '.join(versions)}; docs/timing.md)")


def run(args: argparse.Namespace) -> int:
    cat = build_catalog(args)
    if args.action == "show":
        if not args.name:
            raise UsageError("catalog show: name a preset (see `inference-lab catalog`)")
        name = args.name.lower()
        if name in cat.model_names():
            show_model(cat.load_model(name), cat.source("models", name))
        elif name in cat.hardware_names():
            show_hardware(cat.load_hardware(name), cat.source("hardware", name))
        else:
            raise UsageError(f"no preset {args.name!r}; models: {', '.join(cat.model_names())}; "
                             f"hardware: {', '.join(cat.hardware_names())}")
        return 0
    print(f"{'model':30s} {'total':>12s} {'active':>10s} {'KV B/token':>11s}  layers")
    for name in cat.model_names():
        row = model_row(cat.load_model(name))
        print(f"{name:30s} {_e(row['total_params']):>12s} {_e(row['active_params']):>10s} "
              f"{row['kv_bytes_per_token']:>11,.0f}  {row['layers']}")
    print()
    print(f"{'hardware':10s} {'bf16 FLOP/s':>12s} {'fp8':>10s} {'fp4':>10s} {'HBM GB':>7s} {'TB/s':>6s}")
    for name in cat.hardware_names():
        hw = cat.load_hardware(name)
        f = hw.flops
        print(f"{name:10s} {f.get('bf16', 0):>12.4g} {f.get('fp8', 0):>10.4g} {f.get('fp4', 0):>10.4g} "
              f"{hw.hbm_bytes / 1e9:>7.0f} {hw.hbm_bandwidth / 1e12:>6.3g}")
    return 0
