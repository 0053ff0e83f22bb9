"""Sanity check of the built-in tasks: a small model per task, trained a few minutes on CPU
with a plain AdamW loop, must end well above chance. Not a study: no seeds sweep, no report.

    python benchmarks/task_sanity.py                 # every task
    python benchmarks/task_sanity.py recall text_lm  # some tasks
"""

from __future__ import annotations

import argparse
import collections
import math
import time

import torch

from workbench.model.transformer import build_model
from workbench.registry import variants

# task -> (family, task params, model spec, steps, batch size, learning rate)
RUNS = {
    "copy": ("decoder", {}, {"d_model": 64, "n_layers": 2, "n_heads": 4}, 800, 32, 3e-3),
    "reverse": ("decoder", {}, {"d_model": 64, "n_layers": 2, "n_heads": 4}, 800, 32, 3e-3),
    "sort": ("decoder", {}, {"d_model": 64, "n_layers": 2, "n_heads": 4}, 800, 32, 3e-3),
    # recall: the loss sits at ln(pairs) ("some value of the row") until an induction circuit
    # forms, abruptly, after about 2000-3000 steps; fewer steps stop on the plateau.
    "recall": ("decoder", {}, {"d_model": 64, "n_layers": 2, "n_heads": 4}, 4000, 32, 3e-3),
    "translate": ("encoder_decoder", {}, {"d_model": 64, "n_layers": 2, "n_heads": 4}, 800, 32, 3e-3),
    "text_lm": ("decoder", {}, {"d_model": 128, "n_layers": 2, "n_heads": 4}, 600, 16, 3e-3),
    "classify": ("encoder", {}, {"d_model": 64, "n_layers": 2, "n_heads": 4}, 1500, 32, 1e-3),
}


def chance(name: str, task) -> str:
    """What a model that ignores the input scores, for comparison."""
    p = task.params
    if name in ("copy", "reverse", "sort"):
        return f"accuracy {1 / p.alphabet_size:.3f}, exact_match ~0"
    if name == "recall":
        return f"accuracy {1 / p.n_values:.3f} (uniform value), {1 / p.train_length:.3f} (a value from the row)"
    if name == "translate":
        return "bleu ~0, exact_match 0"
    if name == "text_lm":
        counts = torch.bincount(torch.as_tensor(task.train_text.astype("int64")), minlength=256).double()
        probs = counts / counts.sum()
        unigram = float(-(probs[probs > 0] * probs[probs > 0].log2()).sum())
        return f"bpc {math.log2(len(task.vocab)):.2f} (uniform), {unigram:.2f} (unigram)"
    if name == "classify":
        labels = collections.Counter(task.class_of(ex) for ex in task.eval_examples(p.train_length))
        return f"accuracy {max(labels.values()) / sum(labels.values()):.3f} (majority class)"
    return "?"


def run(name: str, max_seconds: float) -> None:
    family, params, spec, steps, batch_size, lr = RUNS[name]
    cls = variants("task")[name]
    task = cls(cls.Params(**params), seed=0)
    torch.manual_seed(0)
    model = build_model({"family": family, **spec} | task.model_overrides(family))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps, pct_start=0.1)
    start = time.time()
    done = 0
    for step in range(steps):
        loss = task.loss(model, task.train_batch(step, batch_size, family), family)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        done = step + 1
        if time.time() - start > max_seconds:
            break
    train_s = time.time() - start
    scores = task.evaluate(model, task.eval_batches(task.params.train_length, 64, family), family)
    shown = ", ".join(f"{k} {v:.3f}" for k, v in scores.items())
    print(f"{name:9s} {family:15s} {model.num_parameters() / 1e3:6.0f}k params  {done:5d} steps  "
          f"{train_s:6.0f} s  | {shown}  | chance: {chance(name, task)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="*", default=list(RUNS))
    parser.add_argument("--max-seconds", type=float, default=240, help="training time cap per task")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.tasks:
        run(name, args.max_seconds)


if __name__ == "__main__":
    main()
