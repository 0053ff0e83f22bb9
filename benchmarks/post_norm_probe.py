"""Probe: why does 2-layer Post-Norm with RoPE and a tied head not learn reversal?

A plain training loop outside the runner (issue 23's setup): reverse, alphabet 10, length 12,
decoder, d_model 64, 4 heads, GELU, AdamW (weight decay 0.01 on matrices), lr 1e-3, 30 warmup
steps then cosine to 0.1 of the peak, gradient clipping at 1.0, batch 32. Every `--every`
steps it prints held-out teacher-forced accuracy and diagnostics measured on one fixed batch:

  acc      teacher-forced accuracy on the task's 256 held-out strings (length 12)
  self     share of scored positions whose argmax is the current input token (the tied head's
           "echo": with a Post-Norm stream that is mostly the token itself, E^T LN(e_t) peaks at t)
  logit    RMS of the logits (centred per position) at scored positions: the head's scale
  cos      mean pairwise cosine of the 10 symbol embeddings (1 = collapsed to one direction)
  emb      RMS of the symbol embedding rows
  attn     per layer: mean attention entropy over real queries, as a share of the uniform
           (causal) entropy (1 = uniform)
  hit      per layer: attention weight on the symbol to emit at answer positions (the best head)
  branch   per sublayer: RMS of the branch output / RMS of the residual it is added to
  g_in, g_head   RMS of the loss gradient on the symbol rows of E through the input path and
           through the tied head (g_head_common: their mean cosine with the mean symbol row)
  R2_<l>   held-out R^2 of a linear readout, from the stream after block l, of how far back the
           symbol to emit sits (what the next block's RoPE queries must find)
  and on the line below, the training loss and each block's gradient norm (before clipping).

    python -m benchmarks.post_norm_probe                    # Post-Norm, RoPE, tied: stalls
    python -m benchmarks.post_norm_probe --untied           # learns
    python -m benchmarks.post_norm_probe --fan-in-init      # tied, block matrices N(0, 1/fan_in): learns
    python -m benchmarks.post_norm_probe --head-detached    # the head sends E no gradient: stalls
    python -m benchmarks.post_norm_probe --embedding-norm   # BERT's embedding LayerNorm: stalls
    python -m benchmarks.post_norm_probe --norm pre         # Pre-Norm, tied: learns

Findings and figures: the notes of studies/norm-placement.yaml.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

from workbench import build_model
from workbench.model.transformer import record_attention
from workbench.registry import variants

TASK = {"train_length": 12, "min_length": 4, "n_eval": 256, "alphabet_size": 10}


def make_task(seed: int):
    cls = variants("task")["reverse"]
    return cls(cls.Params(**TASK), seed=seed)


def accuracy(model, task) -> float:
    batches = task.eval_batches(12, 256, "decoder")
    return task.evaluate(model, batches, "decoder")["accuracy"]


def symbol_ids(task) -> torch.Tensor:
    return torch.arange(4, len(task.vocab))  # ids 0-3 are pad, bos, eos, sep


@torch.no_grad()
def diagnostics(model, task, batch) -> dict[str, float]:
    tokens, mask = batch["tokens"], batch["padding_mask"]
    real = mask.bool()
    residuals: list[torch.Tensor] = []  # the stream each sublayer's output is added to
    outputs: list[torch.Tensor] = []  # each sublayer's output (its residual branch)
    handles, placements = [], []
    for block in model.decoder.blocks:
        for placement, sublayer in ((block.attn_norm, block.attn), (block.ffn_norm, block.ffn)):
            # Block.forward adds the sublayer's output to the stream that `before` reads.
            placement.before = lambda x, before=placement.before: residuals.append(x) or before(x)
            placements.append(placement)
            handles.append(sublayer.register_forward_hook(lambda m, args, out: outputs.append(out)))
    with record_attention(model) as recorded:
        logits = model(tokens, mask)[:, :-1]
    for handle in handles:
        handle.remove()
    for placement in placements:
        del placement.before  # the class's method again
    stats: dict[str, float] = {}
    targets, scored = task.scored_ids(batch, "decoder")
    stats["self"] = float((logits.argmax(-1) == tokens[:, :-1])[scored].float().mean())
    centred = logits[scored] - logits[scored].mean(-1, keepdim=True)
    stats["logit"] = float(centred.pow(2).mean().sqrt())
    emb = model.embedding.weight[symbol_ids(task)]
    unit = F.normalize(emb, dim=-1)
    k = len(emb)
    stats["cos"] = float(((unit @ unit.T).sum() - k) / (k * (k - 1)))
    stats["emb"] = float(emb.pow(2).mean().sqrt())
    n_src = (tokens == 3).nonzero()[:, 1] - 1  # the <sep> sits at index n + 1
    i = torch.arange(tokens.shape[1])[None, :]
    answer = (i > n_src[:, None]) & (i <= 2 * n_src[:, None])  # positions predicting a source symbol
    source = (2 * n_src[:, None] + 1 - i).clamp(0, tokens.shape[1] - 1)  # where that symbol sits
    for i, (name, weights) in enumerate(recorded.items()):
        w = weights[0]  # [B, h, n, n]
        on_source = w.gather(-1, source[:, None, :, None].expand(-1, w.shape[1], -1, 1))[..., 0]  # [B, h, n]
        stats[f"hit{i}"] = float(on_source.amax(1)[answer].mean())
        visible = recorded.visible[name][0].expand_as(w)
        entropy = -(w.clamp_min(1e-12).log() * w).sum(-1)  # [B, h, n]
        uniform = visible.sum(-1).clamp_min(1).float().log()
        counted = real[:, None, :].expand_as(entropy) & (uniform > 0)
        stats[f"attn{i}"] = float(entropy[counted].sum() / uniform[counted].sum())
    for i, (x, out) in enumerate(zip(residuals, outputs, strict=True)):
        stats[f"branch{i}"] = float(out[real].pow(2).mean().sqrt() / x[real].pow(2).mean().sqrt())
    return stats


class DetachedHead(torch.nn.Module):
    """Logits from the token embedding's current values, with no gradient into it."""

    def __init__(self, embedding: torch.nn.Embedding):
        super().__init__()
        self.embedding = [embedding]  # a list: not a submodule, so no second copy in parameters()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.embedding[0].weight.detach().T


def embedding_gradients(model, task, batch) -> dict[str, float]:
    """RMS of the loss gradient on the symbol rows of E through the input path (g_in) and,
    when the head is tied, through the head (g_head), and the mean cosine of each row's head gradient with the
    mean symbol row (g_head_common: 1 = the head pushes every symbol the same way)."""
    E = model.embedding.weight
    rows = symbol_ids(task)
    if not isinstance(model.head, torch.nn.Linear) or model.head.weight is not E:  # untied or detached
        model.zero_grad(set_to_none=True)
        task.loss(model, batch, "decoder").backward()
        g_in = E.grad[rows]
        model.zero_grad(set_to_none=True)
        return {"g_in": float(g_in.pow(2).mean().sqrt())}
    head_copy = torch.nn.Parameter(E.detach().clone())
    model.head.weight = head_copy
    try:
        model.zero_grad(set_to_none=True)
        task.loss(model, batch, "decoder").backward()
        g_in, g_head = E.grad[rows], head_copy.grad[rows]
    finally:
        model.head.weight = E
        model.zero_grad(set_to_none=True)
    common = F.normalize(E[rows].mean(0), dim=0)
    return {"g_in": float(g_in.pow(2).mean().sqrt()), "g_head": float(g_head.pow(2).mean().sqrt()),
            "g_head_common": float((F.normalize(g_head, dim=-1) @ common.detach()).mean())}


@torch.no_grad()
def offset_readout(model, batch) -> dict[str, float]:
    """What the stream carries about where to read: at each answer position i (predicting the
    symbol stored 2(i - n) - 1 tokens back, for a source of n symbols), the held-out R^2 of a
    linear (ridge) readout of that offset from the hidden state after each block (what
    the next block's queries can use). Fitted on half the rows, scored on the other half."""
    tokens, mask = batch["tokens"], batch["padding_mask"]
    captured = []
    handles = [b.register_forward_hook(lambda m, i, out: captured.append(out)) for b in model.decoder.blocks]
    model(tokens, mask)
    for h in handles:
        h.remove()
    n = (tokens == 3).nonzero()[:, 1] - 1  # the <sep> sits at index n + 1
    i = torch.arange(tokens.shape[1])[None, :]
    answer = (i > n[:, None]) & (i <= 2 * n[:, None])  # positions predicting a source symbol
    offset = (2 * (i - n[:, None]) - 1).float()
    half = torch.zeros_like(answer)
    half[: len(tokens) // 2] = True
    stats = {}
    for layer, hidden in enumerate(captured):
        x = torch.cat([hidden, torch.ones_like(hidden[..., :1])], -1)
        fit, test = answer & half, answer & ~half
        a = x[fit]
        gram = a.T @ a
        ridge = 1e-3 * gram.diagonal().mean() * torch.eye(len(gram))  # ignore directions of ~no variance
        w = torch.linalg.solve(gram + ridge, a.T @ offset[fit][:, None])
        residual = offset[test] - (x[test] @ w)[:, 0]
        stats[f"R2_{layer}"] = float(1 - residual.var() / offset[test].var())
    return stats


def train(args) -> list[tuple[int, float, dict[str, float]]]:
    torch.manual_seed(args.seed)
    task = make_task(args.seed)
    spec = {"family": "decoder", "d_model": 64, "n_heads": 4, "n_layers": args.layers, "ffn": "gelu",
            "norm": args.norm, "position": args.position, "tie_embeddings": not args.untied}
    model = build_model(spec | task.model_overrides("decoder"))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), eps=1e-8)  # the runner's AdamW

    def factor(step: int) -> float:
        if step < args.warmup:
            return (step + 1) / args.warmup
        progress = (step - args.warmup) / max(1, args.steps - args.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    probe_batch = task.train_batch(10**6, 256, "decoder")
    if args.fan_in_init:  # PyTorch-like scale: every block matrix N(0, 1/fan_in), branches O(1) at init
        for block in model.decoder.blocks:
            for m in block.modules():
                if isinstance(m, torch.nn.Linear):
                    torch.nn.init.normal_(m.weight, std=m.in_features ** -0.5)
    if args.head_detached:  # the head reads E's values but sends no gradient into E
        model.head = DetachedHead(model.embedding)
    if args.embedding_norm:  # BERT's embedding LayerNorm (no parameters): layer 0 reads unit-RMS rows
        model.embedding.register_forward_hook(lambda m, inp, out: F.layer_norm(out, out.shape[-1:]))
    history = []
    for step in range(args.steps + 1):
        if step % args.every == 0:
            model.eval()
            stats = diagnostics(model, task, probe_batch)
            stats.update(embedding_gradients(model, task, probe_batch))
            stats.update(offset_readout(model, probe_batch))
            model.train()
            acc = accuracy(model, task)
            history.append((step, acc, stats))
            print(f"step {step:5d} acc {acc:.3f} " + " ".join(f"{k} {v:.3f}" for k, v in stats.items()), flush=True)
        if step == args.steps:
            break
        batch = task.train_batch(step, 32, "decoder")
        loss = task.loss(model, batch, "decoder")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if step % args.every == 0:
            norms = [torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in b.parameters() if p.grad is not None]))
                     for b in model.decoder.blocks]
            print(f"          loss {loss.item():.3f} grad " + " ".join(f"{float(n):.3g}" for n in norms), flush=True)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
    return history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--norm", default="post", choices=["pre", "post"])
    parser.add_argument("--position", default="rope")
    parser.add_argument("--untied", action="store_true", help="an output head of its own")
    parser.add_argument("--head-detached", action="store_true", help="tied values, no head gradient into E")
    parser.add_argument("--embedding-norm", action="store_true", help="LayerNorm on the embeddings (BERT)")
    parser.add_argument("--fan-in-init", action="store_true", help="block matrices N(0, 1/fan_in), not N(0, 0.02)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train(args)


if __name__ == "__main__":
    main()
