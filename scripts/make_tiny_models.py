#!/usr/bin/env python3
"""Write the offline tiny models of the GPU harness (``gpu_harness/model_factory.py``, whose
docstring says what each is and why) into ``--out``; ``--check`` verifies tensor names and shapes
and runs the greedy probes on CPU.

    python3 scripts/make_tiny_models.py --out /tmp/models   # -> /tmp/models/{target,draft,eagle3,eagle,mimov2,...}
    python3 scripts/make_tiny_models.py --out /tmp/models --check  # + verify names/shapes + greedy probes
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_harness import model_factory  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(model_factory.__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True,
                   help="output directory; gets target/, draft/, eagle3/, eagle/, mimov2/, mimov2-mtp/ and deepseek/")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--target-layers", type=int, default=4)
    p.add_argument("--draft-layers", type=int, default=2)
    p.add_argument("--hidden-size", type=int, default=512)
    p.add_argument("--intermediate-size", type=int, default=1024)
    p.add_argument("--num-heads", type=int, default=8)
    p.add_argument("--num-kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--max-position-embeddings", type=int, default=4096)
    p.add_argument("--linear-std", type=float, default=0.05)
    p.add_argument("--embed-std", type=float, default=1.0)
    p.add_argument("--lm-head-std", type=float, default=0.2)
    p.add_argument("--late-layer-scale", type=float, default=0.5, help="std multiplier for target layers the draft lacks")
    p.add_argument("--eagle-mix", type=float, default=0.1, help="share of the target's hidden state in the EAGLE draft's fc")
    p.add_argument("--check", action="store_true", help="verify tensor names/shapes; with transformers installed also greedy-probe on CPU")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tdir, ddir = model_factory.make_models(
        args.out,
        seed=args.seed,
        target_layers=args.target_layers,
        draft_layers=args.draft_layers,
        linear_std=args.linear_std,
        embed_std=args.embed_std,
        lm_head_std=args.lm_head_std,
        late_layer_scale=args.late_layer_scale,
        eagle_mix=args.eagle_mix,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        head_dim=args.head_dim,
        vocab_size=args.vocab_size,
        max_position_embeddings=args.max_position_embeddings,
    )
    mtp_dirs = (args.out / model_factory.MIMOV2_DIRNAME, args.out / model_factory.MIMOV2_MTP_DIRNAME)
    edir = args.out / model_factory.EAGLE_DIRNAME
    mla = args.out / model_factory.DEEPSEEK_DIRNAME
    print(f"wrote {tdir}, {ddir}, {args.out / model_factory.EAGLE3_DIRNAME}, {edir}, {mtp_dirs[0]}, {mtp_dirs[1]} "
          f"and {mla}")
    if not args.check:
        return 0
    problems = [p for d in (tdir, ddir, args.out / model_factory.EAGLE3_DIRNAME, edir, *mtp_dirs, mla)
                for p in model_factory.check_model_dir(d)]
    for p in problems:
        print("PROBLEM:", p)
    if problems:
        return 1
    print("tensor names/shapes/dtypes OK")
    mtp = model_factory.mtp_greedy_probe(*mtp_dirs)
    print(f"MiMoV2 greedy probe (plain torch): distinct tokens per output {mtp['distinct_per_output']}, "
          f"MTP layer / target agreement {[round(a, 2) for a in mtp['mtp_agreement']]}")
    ds = model_factory.deepseek_greedy_probe(mla)
    print(f"DeepSeek greedy probe (plain torch): distinct tokens per output {ds['distinct_per_output']}, NextN "
          f"first step / target agreement {ds['nextn_agreement']:.2f}, chain (3 steps, topk 1) accepts "
          f"{ds['mean_accept_length']:.2f} tokens a step {ds['accept_lengths']}")
    eagle = model_factory.eagle_greedy_probe(tdir, edir)
    tree = model_factory.eagle_tree_probe(tdir, edir)
    print(f"EAGLE greedy probe (plain torch): draft step / target agreement {eagle['eagle_agreement']:.2f}, "
          f"target's token in the draft's top 4 {eagle['eagle_top4']:.2f}, SGLang's auto tree (5 / 4 / 8) "
          f"accepts {tree['mean_accept_length']:.2f} tokens a step")
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers not installed: skipping the greedy probe")
        return 0
    report = model_factory.hf_greedy_probe(tdir, ddir)
    print(f"HF greedy probe: distinct tokens per output {report['distinct_per_output']}, "
          f"draft/target argmax agreement {report['draft_agreement']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
