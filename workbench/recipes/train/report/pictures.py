"""Pictures of what a trained model does: attention heatmaps on the task's sample input and
the position scheme's signal, drawn from the final weights a run left in its folder.

For each pictured variant (those the study's `expect:` entries compare, at a scale ladder's first
rung: workbench.recipes.train.report.build.pictured_variants), the finished run with the lowest
seed is loaded (no training happens); the runs loaded are what `--with-data` ships:
    - the last layer's attention on the task's first sample, one panel per head: the
      decoder's cross-attention for encoder-decoder models ("我 爱 猫" -> "I love cats"),
      self-attention otherwise;
    - for samples that contain a referring word (FOCUS_TOKENS, e.g. 它 in the tutorials'
      pronoun sentence), the attention row of that word in the last layer reading the source:
      which noun does "it" look at;
    - the position scheme as a heatmap, by the hook it uses: the encoding it adds to the
      embeddings (sinusoidal, learned), the q.k score of identical vectors placed at every
      pair of positions (RoPE: depends only on the offset), or the score bias per head
      (ALiBi). A scheme with no hook (NoPE) has nothing to draw;
    - head similarity (claim E13: heads are often redundant): per attention layer, the
      Jensen-Shannon divergence between every two heads' attention rows on the sample,
      averaged over query rows (0 = the two heads attend identically, 1 bit = disjoint).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from workbench.errors import WorkbenchError
from workbench.model.transformer import record_attention
from workbench.model.position import PositionScheme
from workbench.report import ReportSkipWarning, figures
from workbench.report.document import Figure, Item, Paragraph, Table, fmt
from workbench.report.sweep_points import Variants
from workbench.model.weights import load_pictured_model, make_task
from workbench.variants import variant_names

# Referring words whose attention row is drawn when a sample contains them.
FOCUS_TOKENS = ("它", "it")
MAX_VARIANTS = 8  # a report shows at most this many variants' pictures (sweep order)
POSITION_PICTURE_LENGTH = 64


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_")[:60] or "variant"


def token_legend(tokens: list[str]) -> list[str]:
    """`#i = token` for the tokens a figure had to show by index (no installed font has them)."""
    labels, replaced = figures.tick_labels(tokens)
    return [f"{label} = {token}" for label, token in zip(labels, tokens) if label != token] if replaced else []


def last_layer(recorded: dict[str, list[Tensor]], kind: str, stack: str) -> tuple[str, Tensor] | None:
    """The last `kind` ("attn" or "cross") layer of `stack` with its weights of the first call."""
    names = [n for n in recorded if n.startswith(f"{stack}.") and n.endswith(f".{kind}") and recorded[n]]
    if not names:
        return None
    name = max(names, key=lambda n: int(n.split(".")[2]))
    return name, recorded[name][0][0].float().cpu()  # first call, first example: [h, nq, nk]


def js_divergence(p: Tensor, q: Tensor) -> Tensor:
    """Jensen-Shannon divergence in bits between distributions on the last axis (0..1)."""
    m = (p + q) / 2

    def kl(a: Tensor) -> Tensor:  # KL(a || m); 0 * log 0 = 0
        return torch.where(a > 0, a * torch.log2(a / m.clamp_min(1e-30)), torch.zeros_like(a)).sum(-1)

    return (kl(p) + kl(q)) / 2


def head_divergence(weights: Tensor) -> np.ndarray:
    """[h, nq, nk] attention of one layer -> [h, h] JS divergence of every two heads' rows,
    averaged over query rows."""
    w = weights.double()
    return js_divergence(w[:, None], w[None, :]).mean(-1).float().numpy()  # [h, h, nq] -> [h, h]


def forward_sample(model, batch: dict[str, Tensor], family: str) -> dict[str, list[Tensor]]:
    """One teacher-forced forward of the sample batch with attention recorded."""
    with torch.no_grad(), record_attention(model) as recorded:
        if family == "encoder_decoder":
            model(batch["src"], batch["tgt"][:, :-1], src_padding_mask=batch["src_mask"],
                  tgt_padding_mask=batch["tgt_mask"][:, :-1])
        else:
            model(batch["tokens"], batch["padding_mask"])
    return {name: list(calls) for name, calls in recorded.items()}


def real_length(mask: Tensor) -> int:
    return int(mask.sum())


class ModelPictures:
    """Callable given to the training report: (variants, finished runs, report folder) -> items.

    `run_dir` maps a run id to its folder; `load` returns (model, config) from a run folder
    and `make_task` a task from a run config (workbench.model.weights' functions by default)."""

    def __init__(self, run_dir: Callable[[str], Path], load: Callable[[Path], tuple[Any, dict]] = load_pictured_model,
                 make_task: Callable[[dict], Any] = make_task):
        self.run_dir, self.load, self.make_task = run_dir, load, make_task
        self.loaded: list[str] = []  # the runs whose weights were drawn from: what a report ships (--with-data)

    def __call__(self, variants: Variants, finished: pd.DataFrame, dest: Path, pictured: list[str] | None = None,
                 which: str = "with a finished run") -> list[Item]:
        """Pictures of the `pictured` variants (default: all) that finished, at most MAX_VARIANTS;
        `which` says in the report what the pictured ones are when they are fewer than all."""
        items: list[Item] = []
        shown = [v for v in (variants.labels if pictured is None else pictured)
                 if v in set(finished["variant"])][:MAX_VARIANTS]
        if len(shown) < len(variants.labels):
            items.append(Paragraph(f"Pictures for {len(shown)} of {len(variants.labels)} variants "
                                   f"({which}, in sweep order)."))
        position_drawn: set[str] = set()
        drawn_names: dict[str, int] = {}  # position scheme -> pictures of it so far
        for variant in shown:
            run = finished[finished["variant"] == variant].sort_values("seed").iloc[0]
            folder = self.run_dir(str(run["run_id"]))
            try:
                model, config = self.load(folder)
            except FileNotFoundError:
                items.append(Paragraph(f"{variant}: no final weights in {folder.name} (trained before they were kept?)."))
                continue
            self.loaded.append(str(run["run_id"]))
            torch.manual_seed(0)
            try:
                task = self.make_task(config)
            except WorkbenchError as err:  # e.g. a text task whose corpus is not on this machine
                warnings.warn(f"{variant}: no attention pictures ({err})", ReportSkipWarning, stacklevel=2)
                items.append(Paragraph(f"{variant}: no attention pictures: its task cannot be made here ({err})."))
                continue
            family = config["model"]["family"]
            caption_run = f"{variant}, seed {int(run['seed'])}"
            items += self.attention_items(model, task, family, dest, variant, caption_run)
            position = config["model"]["position"]
            key = repr(sorted(position.items())) if isinstance(position, dict) else str(position)
            scheme_learned = isinstance(position, dict) and position.get("name") == "learned"
            if key not in position_drawn or scheme_learned:  # a learned table differs per run
                position_drawn.add(key)
                # named after the scheme it draws (not the variant: sweeping the FFN gave position_gelu.png);
                # a second drawing of a scheme (other parameters, or a learned table) gets a number
                # a per-layer pattern ({repeat: [...]} or a list) draws its first layer's scheme
                scheme = variant_names(config["model"], "position")[0] if isinstance(position, (dict, list)) else str(position)
                drawn_names[scheme] = drawn_names.get(scheme, 0) + 1
                name = scheme if drawn_names[scheme] == 1 else f"{scheme}_{drawn_names[scheme]}"
                items += self.position_items(model, dest, name, caption_run)
        return items

    # ---- attention ---------------------------------------------------------------------------

    def attention_items(self, model, task, family: str, dest: Path, variant: str, caption_run: str) -> list[Item]:
        sample = task.sample(family)
        batch, tokens = sample["batch"], sample["batch_tokens"]
        recorded = forward_sample(model, batch, family)
        out: list[Item] = []
        fig_dir = dest / "figures"
        if family == "encoder_decoder":
            src_n, tgt_n = real_length(batch["src_mask"][0]), real_length(batch["tgt_mask"][0]) - 1
            x_tokens, y_tokens = tokens["src"][0][:src_n], tokens["tgt"][0][:tgt_n]
            found = last_layer(recorded, "cross", "decoder")
            what = "cross-attention (decoder queries reading the source)"
            xlabel, ylabel = "source token (key)", "target token (query)"
        else:
            n = real_length(batch["padding_mask"][0])
            x_tokens = y_tokens = tokens["tokens"][0][:n]
            found = last_layer(recorded, "attn", "encoder" if family == "encoder" else "decoder")
            what = "self-attention"
            xlabel, ylabel = "key token", "query token"
        if found is not None:
            name, weights = found
            panels = [(f"head {h}", weights[h, : len(y_tokens), : len(x_tokens)].numpy()) for h in range(weights.shape[0])]
            path = figures.heatmaps(panels, fig_dir / f"attention_{slug(variant)}.png", x_tokens=x_tokens,
                                    y_tokens=y_tokens, xlabel=xlabel, ylabel=ylabel,
                                    title=f"{variant}: {what}, {name}")
            out.append(Figure(path.relative_to(dest).as_posix(),
                              f"{caption_run}: {what} of layer {name} on the sample "
                              f"\"{task.words_text(x_tokens)}\", one panel per head (rows sum to 1).",
                              f"attention heatmap of {variant}", token_legend(list(dict.fromkeys(x_tokens + y_tokens)))))
        out += self.focus_items(recorded_for_samples(model, task, family), task, family, dest, variant, caption_run)
        out += head_similarity_items(recorded, real_lengths(batch, family), caption_run)
        return out

    def focus_items(self, per_sample, task, family: str, dest: Path, variant: str, caption_run: str) -> list[Item]:
        """The attention row of a referring word (它) over the source, per head, per sample."""
        out: list[Item] = []
        stack = "decoder" if family == "decoder" else "encoder"
        for i, (source_tokens, recorded) in enumerate(per_sample):
            focus = next((t for t in FOCUS_TOKENS if t in source_tokens), None)
            found = last_layer(recorded, "attn", stack)
            if focus is None or found is None:
                continue
            name, weights = found
            q = source_tokens.index(focus)
            keys = source_tokens if family != "decoder" else source_tokens[: q + 1]
            row = weights[:, q, : len(keys)].numpy()
            path = figures.attention_row(row, dest / "figures" / f"focus_{slug(variant)}_{i}.png", query=focus,
                                         key_tokens=keys, title=f"{variant}: where {figures.printable(repr(focus), 'the pronoun')} looks ({name})")
            sentence = task.words_text(source_tokens)  # decoded text, not byte-level BPE pieces
            top = [keys[int(np.argmax(row[h]))] for h in range(row.shape[0])]
            out.append(Figure(path.relative_to(dest).as_posix(),
                              f"{caption_run}: attention of {focus!r} over \"{sentence}\" in {name}, per head; "
                              f"most-attended token per head: {', '.join(top)}.",
                              f"attention row of {focus} for {variant}", token_legend(keys)))
        return out

    # ---- position scheme ---------------------------------------------------------------------

    def position_items(self, model, dest: Path, name: str, caption_run: str) -> list[Item]:
        """The position scheme's picture, saved as position_<name>.png."""
        scheme = next((m for m in model.modules() if isinstance(m, PositionScheme)), None)
        if scheme is None:
            return []
        drawn = position_picture(scheme)
        if drawn is None:
            return [Paragraph(f"{caption_run}: the position scheme {scheme.name!r} adds no position signal to draw.")]
        matrix, kind = drawn
        path = dest / "figures" / f"position_{slug(name)}.png"
        labels = {
            "embed": ("dimension", "position", f"{scheme.name}: encoding added to the embeddings", "value"),
            "rotate": ("key position", "query position", f"{scheme.name}: q·k of one vector at every pair of positions",
                       "score"),
            "score_bias": ("key position", "query position", f"{scheme.name}: score bias (first and last head)",
                           "bias"),
        }[kind]
        if kind == "score_bias":
            panels = [(f"head {h}", m) for h, m in matrix]
            n = panels[0][1].shape[0]
            ticks = [str(i) for i in range(n)]
            vmin, vmax, cmap = bias_scale(np.stack([m for _, m in panels]))
            figures.heatmaps(panels, path, x_tokens=ticks, y_tokens=ticks, xlabel=labels[0], ylabel=labels[1],
                             title=labels[2], cmap=cmap, vmin=vmin, vmax=vmax, colorbar_label=labels[3])
        else:
            figures.matrix_heatmap(matrix, path, xlabel=labels[0], ylabel=labels[1], title=labels[2],
                                   colorbar_label=labels[3])
        note = f" ({scheme.picture_note})" if scheme.picture_note else ""
        return [Figure(path.relative_to(dest).as_posix(), f"{caption_run}: {labels[2]}{note}.",
                       f"position scheme {name}")]


def bias_scale(values: np.ndarray) -> tuple[float, float, str]:
    """(vmin, vmax, colormap) for score-bias panels, from the values drawn: one scale for every
    head so heads compare; a one-signed bias runs from 0 to its extreme (a penalty such as
    ALiBi's, magma), a bias of both signs is centred on 0 (a learned bias, diverging)."""
    lo, hi = float(values.min()), float(values.max())
    if lo >= 0 or hi <= 0:
        return min(lo, 0.0), max(hi, 0.0), "magma"
    edge = max(-lo, hi)
    return -edge, edge, "RdBu_r"


def real_lengths(batch: dict[str, Tensor], family: str) -> dict[str, int]:
    """Real (unpadded) query/key lengths of the first sample row, by stack name."""
    if family == "encoder_decoder":
        # The decoder reads tgt[:, :-1] (teacher forcing), so one position fewer than tgt.
        return {"encoder": real_length(batch["src_mask"][0]), "decoder": real_length(batch["tgt_mask"][0]) - 1}
    n = real_length(batch["padding_mask"][0])
    return {"encoder": n, "decoder": n}


def head_similarity_items(recorded: dict[str, list[Tensor]], lengths: dict[str, int], caption_run: str) -> list[Item]:
    """One table: per attention layer of the sample forward, how alike its heads attend."""
    rows = []
    for name in sorted(recorded, key=layer_order):
        if not recorded[name]:
            continue
        stack, kind = name.split(".")[0], name.split(".")[-1]
        nq = lengths[stack]
        nk = lengths["encoder"] if kind == "cross" else nq
        weights = recorded[name][0][0, :, :nq, :nk].float().cpu()  # first call, first example: [h, nq, nk]
        h = weights.shape[0]
        if h < 2:
            continue
        div = head_divergence(weights)
        pairs = [(float(div[i, j]), i, j) for i in range(h) for j in range(i + 1, h)]
        low, high = min(pairs), max(pairs)
        rows.append([name, str(h), fmt(float(np.mean([d for d, _, _ in pairs]))),
                     f"{low[1]}-{low[2]}: {fmt(low[0])}", f"{high[1]}-{high[2]}: {fmt(high[0])}"])
    if not rows:
        return []
    return [Table(["layer", "heads", "mean JS between heads (bits)", "most alike pair", "most different pair"], rows,
                  caption=f"{caption_run}: head similarity on the sample (Jensen-Shannon divergence of two heads' "
                          "attention rows, averaged over query rows; 0 = identical, 1 = disjoint)",
                  numeric=[False, True, True, False, False])]


def layer_order(name: str) -> tuple:
    """encoder before decoder, blocks in order, self-attention before cross-attention."""
    parts = name.split(".")
    return (parts[0] != "encoder", *(int(p) if p.isdigit() else p for p in parts[1:]))


def recorded_for_samples(model, task, family: str) -> list[tuple[list[str], dict[str, list[Tensor]]]]:
    """(source tokens, recorded attention) for each sample example that has a focus token."""
    out = []
    examples = task.sample_examples()
    for ex in examples:
        source = task.decode(ex.source)
        if not any(t in source for t in FOCUS_TOKENS):
            continue
        batch = task.collate([ex], family)
        recorded = forward_sample(model, batch, family)
        if family == "decoder":  # the decoder reads <bos> source ...: align tokens to positions
            source = task.decode(batch["tokens"][0].tolist())[: real_length(batch["padding_mask"][0])]
        out.append((source, recorded))
    return out


@torch.no_grad()
def position_picture(scheme: PositionScheme, n: int = POSITION_PICTURE_LENGTH):
    """(matrix, hook) for the hook the scheme overrides, or None when it overrides none."""
    cls = type(scheme)
    if scheme.max_length is not None:
        n = min(n, scheme.max_length)
    pos = torch.arange(n)[None]  # [1, n]
    if cls.embed is not PositionScheme.embed:
        x = torch.zeros(1, n, scheme.d_model)
        return scheme.embed(x, pos)[0].float().numpy(), "embed"  # [n, d_model]
    if cls.rotate is not PositionScheme.rotate:
        g = torch.Generator().manual_seed(0)
        v = torch.randn(scheme.head_dim, generator=g)
        q = v.expand(1, 1, n, scheme.head_dim).clone()  # the same vector at every position
        k = q.clone()
        q, k = scheme.rotate(q, k, pos, pos)
        scores = (q[0, 0] @ k[0, 0].T) / math.sqrt(scheme.head_dim)
        return scores.float().numpy(), "rotate"  # [n, n]
    if cls.score_bias is not PositionScheme.score_bias:
        rel = (pos[:, :, None] - pos[:, None, :])[:, None]  # [1, 1, n, n]
        bias = scheme.score_bias(rel)[0].float()  # [h, n, n]
        heads = sorted({0, bias.shape[0] - 1})
        return [(h, bias[h].numpy()) for h in heads], "score_bias"
    return None
