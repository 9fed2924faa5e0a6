"""Advice with numbers, from what the run recorded: attention head-dim padding (TPU705) and
shape buckets for the dimensions that vary from step to step (TPU706)."""

from __future__ import annotations

import math
from collections import Counter

from tpukit.buckets import optimal_buckets, padding_overhead
from tpukit.findings import Finding
from tpukit.run.loops import Loops
from tpukit.run.run_finding import finding
from tpukit.run.attention import SDPA, AttentionSite
from tpukit.run.frames import is_user_file
from tpukit.run.steps import Step

# Width of the matrix unit (MXU) per TPU generation.
MXU_WIDTH = {"v2": 128, "v3": 128, "v4": 128, "v5e": 128, "v5p": 128, "v6e": 256, "v7": 256}
DEFAULT_GENERATION = "v5e"
MLP_RATIO = 4  # the standard transformer block the FLOP share assumes
MAX_BUDGET_TABLE = 8
PAD_WORTH = 0.25  # padding is advised while it adds at most this share of a layer's FLOPs


# -- head dim ----------------------------------------------------------------------------------
def head_dim_findings(sites: list[AttentionSite], generation: str, assumed: bool,
                      script: str) -> list[Finding]:
    width = MXU_WIDTH[generation]
    findings = []
    for site in sites:
        d = site.head_dim
        if d % width == 0:
            continue
        padded = math.ceil(d / width) * width
        findings.append(_head_dim_finding(site, d, padded, width, generation, assumed, script))
    return findings


def head_dim_numbers(site: AttentionSite, d: int, padded: int, width: int) -> dict:
    """FLOP and memory cost of padding d -> padded, and the MXU use now and after."""
    numbers: dict = {
        "head_dim": d, "padded_head_dim": padded, "mxu_width": width,
        "mxu_fill_now": round(d / padded, 4),
        "attention_matmul_flops_overhead": round(padded / d - 1, 4),
        "layer_flops_overhead": None, "extra_activation_bytes_per_layer": None,
        "wider_heads": None,
    }
    heads, seq = site.heads, site.seq_len
    if heads:
        embed = heads * d
        if seq:
            # FLOPs of one layer over a sequence of T tokens (2 per multiply-add): q/k/v/out
            # projections 8*T*E^2, the MLP 4*MLP_RATIO*T*E^2, q@k^T and attn@v 4*T^2*E.
            dense = (8 + 4 * MLP_RATIO) * seq * embed * embed
            attention = 4 * seq * seq * embed
            share = attention / (attention + dense)
            numbers["attention_flops_share"] = round(share, 4)
            numbers["layer_flops_overhead"] = round(share * (padded / d - 1), 4)
            if site.batch and site.element_size:
                numbers["extra_activation_bytes_per_layer"] = (
                    4 * site.batch * heads * seq * (padded - d) * site.element_size)
        if embed % width == 0 and embed // width < heads:
            numbers["wider_heads"] = {"heads": embed // width, "head_dim": width}
    return numbers


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**17 else f"{n / 1024:.1f} KiB"


def _head_dim_finding(site: AttentionSite, d: int, padded: int, width: int, generation: str,
                      assumed: bool, script: str) -> Finding:
    n = head_dim_numbers(site, d, padded, width)
    more = len(site.modules) - 1
    where = site.module + (f" and {more} more" if more > 0 else "")
    heads = f"{site.heads} heads, " if site.heads else ""
    called = (f", scaled_dot_product_attention called at line {site.call_at[1]}"
              if site.source == SDPA and site.call_at else "")
    gen = f"{generation}{' (assumed; set --tpu-generation)' if assumed else ''}"
    cost = f"+{n['attention_matmul_flops_overhead']:.0%} FLOPs in q@k^T and attn@v"
    if n["layer_flops_overhead"] is not None:
        cost += (f" ({n['layer_flops_overhead']:+.1%} of a transformer layer's FLOPs at seq "
                 f"{site.seq_len}, embed {site.heads * d}, {MLP_RATIO}x MLP)")
    if n["extra_activation_bytes_per_layer"]:
        cost += (f", +{_mib(n['extra_activation_bytes_per_layer'])} of q/k/v/output activations "
                 f"per layer (batch {site.batch}, {site.dtype})")
    advice = recommendation(n)
    head = f"attention head dim {d} ({heads}{site.source}) in {site.cls} ({where}{called})"
    message = (f"the {gen} MXU is {width} wide, so q@k^T and attn@v fill {n['mxu_fill_now']:.0%} "
               f"of each pass. Padding q/k/v to {padded} costs {cost}, runs the same passes "
               "(about the same time, every pass full) and makes the Pallas flash attention "
               "kernels usable (they need a multiple of 128)")
    wide = n["wider_heads"]
    if wide:
        count = f"{wide['heads']} head{'s' if wide['heads'] > 1 else ''}"
        message += (f"; for a model trained from scratch, {count} of {wide['head_dim']} keep "
                    "the same width and FLOPs with every pass full")
    if advice != "pad":
        message += (". Here padding costs more than it can gain"
                    + (": prefer the wider heads" if advice == "wider_heads"
                       else ": leave the head dim as it is"))
    snippet = (f"pad = {padded} - q.size(-1)\n"
               "y = F.scaled_dot_product_attention(F.pad(q, (0, pad)), F.pad(k, (0, pad)), "
               "F.pad(v, (0, pad)), is_causal=True, scale=q.size(-1) ** -0.5)[..., :q.size(-1)]")
    # A class of the user's is named at its definition; a library one (nn.MultiheadAttention)
    # at the user line that called it.
    own_class = site.class_at if site.class_at and is_user_file(site.class_at[0]) else None
    at = own_class or site.call_at or site.class_at or (script, 1)
    fix = {"pad": f"pad q, k and v to head dim {padded} (the snippet) and slice the output back",
           "wider_heads": (f"for a model trained from scratch, use {wide['heads']} heads of "
                           f"{wide['head_dim']}" if wide else ""),
           "leave": ""}[advice]  # padding costs more than it gains: nothing to change
    return finding("TPU705", head, at, cause=message, fix=fix, tpu_generation=generation,
                   generation_assumed=assumed, site=site.to_dict(), snippet=snippet,
                   recommendation=advice, **n)


def recommendation(numbers: dict) -> str:
    """"pad" when padding costs at most PAD_WORTH of a layer's FLOPs (or, with the layer
    unknown, at most doubles the attention matmuls); else "wider_heads" where the width allows
    them, else "leave" (a toy-sized head dim: padding would multiply the attention FLOPs)."""
    layer = numbers["layer_flops_overhead"]
    cheap = (layer <= PAD_WORTH if layer is not None
             else numbers["attention_matmul_flops_overhead"] <= 1.0)
    if cheap:
        return "pad"
    return "wider_heads" if numbers["wider_heads"] else "leave"


# -- shape buckets -----------------------------------------------------------------------------
def _axes(steps: list[Step]) -> list[dict]:
    """The (input, dim) pairs whose size varies over `steps`, grouped into axes: pairs that
    take the same size in every step (input_ids and labels along the sequence) are one axis."""
    names = sorted({n for s in steps for n in s.shapes})
    series: dict[tuple[str, int], tuple] = {}
    for name in names:
        shapes = [s.shapes[name][0] for s in steps if name in s.shapes]
        if len(shapes) < 2 or len({len(sh) for sh in shapes}) != 1:
            continue
        for dim in range(len(shapes[0])):
            if len({sh[dim] for sh in shapes}) > 1:
                series[(name, dim)] = tuple(s.shapes[name][0][dim] if name in s.shapes else None
                                            for s in steps)
    axes: dict[tuple, list[tuple[str, int]]] = {}
    for key, values in series.items():
        axes.setdefault(values, []).append(key)
    # A DataLoader batch first: padding it in the collate_fn is the fix that covers the rest.
    return [{"members": sorted(members, key=lambda m: (not m[0].startswith("batch"), m)),
             "values": values} for values, members in axes.items()]


def bucket_findings(steps: list[Step], loops: Loops, budget: int, script: str) -> list[Finding]:
    findings = []
    for members in loops.members.values():
        complete = [s for s in members if s.complete]
        for axis in _axes(complete):
            found = _bucket_finding(complete, axis, budget, script)
            if found is not None:
                findings.append(found)
    return findings


def _bucket_finding(steps: list[Step], axis: dict, budget: int, script: str) -> Finding | None:
    members = axis["members"]
    weights: Counter = Counter()  # size -> elements one unit of it stands for, over all steps
    for step, value in zip(steps, axis["values"]):
        if value is None:
            continue
        for name, dim in members:
            if name in step.shapes:
                sizes = step.shapes[name][0]
                weights[value] += math.prod(sizes) // sizes[dim] if sizes[dim] else 0
    observed = Counter(v for v in axis["values"] if v is not None)
    distinct = len(observed)
    if distinct <= budget:
        return None  # already within the compile budget
    buckets = optimal_buckets(weights, budget)
    compiles_now = _compiles(steps, axis["values"])
    if compiles_now <= len(buckets):
        return None  # the sizes vary but do not drive compiles (or no more than buckets would)
    overhead = padding_overhead(weights, buckets)
    powers = sorted({2 ** math.ceil(math.log2(v)) for v in observed})
    powers_overhead = padding_overhead(weights, powers)
    table = {}  # k -> the optimum for k buckets (the one computed above for k = budget)
    for k in range(1, min(MAX_BUDGET_TABLE, distinct) + 1):
        chosen = buckets if k == budget else optimal_buckets(weights, k)
        cost = overhead if k == budget else padding_overhead(weights, chosen)
        table[k] = {"buckets": chosen, "padding_overhead": round(cost, 4)}
    name, dim = members[0]
    also = [f"{n} dim {d}" for n, d in members[1:]]
    origin = next((s.origins[name] for s in steps if name in s.origins), None)
    snippet, how = _bucket_snippet(name, dim, buckets)
    head = (f"`{name}` dim {dim}{' (with ' + ', '.join(also) + ')' if also else ''} took "
            f"{distinct} sizes in {sum(observed.values())} steps "
            f"({min(observed)}..{max(observed)}), and {compiles_now} of those steps compiled a "
            "graph")
    cause = (f"XLA compiles a graph per size; with the {len(buckets)} buckets {buckets} the loop "
             f"compiles at most {len(buckets)} graphs for this dim, padding {overhead:.1%} more "
             f"elements (the exact optimum for {budget} buckets; powers of two {powers} would "
             f"pad {powers_overhead:.1%} in {len(powers)} graphs)")
    fix = f"{how}; a size above {buckets[-1]} is padded to a multiple of it (one more graph)"
    extra = {
        "inputs": [{"name": n, "dim": d} for n, d in members], "distinct_sizes": distinct,
        "sizes": dict(sorted(observed.items())), "steps_compiling": compiles_now,
        "budget": budget, "buckets": buckets, "compiles_with_buckets": len(buckets),
        "padding_overhead": round(overhead, 4), "powers_of_two": powers,
        "powers_of_two_overhead": round(powers_overhead, 4),
        "by_budget": table, "snippet": snippet,
    }
    return finding("TPU706", head, origin or steps[0].boundary_at or (script, 1), cause=cause,
                   fix=fix, **extra)


def _compiles(steps: list[Step], values: tuple) -> int:
    return sum(1 for s, v in zip(steps, values) if v is not None and s.compiles)


def _bucket_snippet(name: str, dim: int, buckets: list[int]) -> tuple[str, str]:
    """(code, one-line instruction): a collate_fn for DataLoader batches, pad_to_bucket for a
    forward input (the batch was built by hand)."""
    if name.startswith("batch"):
        sample_dim = max(dim - 1, 0)
        code = ("from tpukit.buckets import BucketCollate\n"
                f"loader = DataLoader(dataset, ..., collate_fn=BucketCollate({buckets}, "
                f"dim={sample_dim}))")
        return code, (f"`DataLoader(..., collate_fn=BucketCollate({buckets}, dim={sample_dim}))` "
                      "from tpukit.buckets (labels padded with -100)")
    code = ("from tpukit.buckets import pad_to_bucket\n"
            f"x = pad_to_bucket(x, {dim}, {buckets}, value=PAD_ID)  # and labels with value=-100")
    return code, (f"`pad_to_bucket(x, {dim}, {buckets}, value=PAD_ID)` from tpukit.buckets "
                  "before the forward (labels with value=-100)")
