"""Shipped weights (workbench.model.weights.write_shipped_weights): float16, metadata kept, and the
same bytes from every process, so a re-issued report adds no new blob for unchanged weights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import safetensors.torch
import torch
from safetensors import safe_open

WRITE = """
import sys
from pathlib import Path
from workbench.model.weights import write_shipped_weights
assert write_shipped_weights(Path(sys.argv[1]), Path(sys.argv[2]))
"""


def test_shipped_weights_are_the_same_bytes_from_every_process(tmp_path):
    source = tmp_path / "final.safetensors"
    tensors = {f"layer{i}.weight": torch.randn(4, 3, generator=torch.Generator().manual_seed(i)) for i in range(6)}
    metadata = {"config": '{"seed": 0}', "step": "800", **{f"tied{i}": f"layer{i}.weight" for i in range(6)}}
    safetensors.torch.save_file(tensors, str(source), metadata=metadata)

    written = []
    for n in range(3):  # each process hashes its maps with a key of its own
        target = tmp_path / f"shipped{n}.safetensors"
        subprocess.run([sys.executable, "-c", WRITE, str(source), str(target)], check=True)
        written.append(target.read_bytes())

    assert written[0] == written[1] == written[2]
    with safe_open(str(tmp_path / "shipped0.safetensors"), framework="pt") as f:
        assert f.metadata() == metadata
        for name, tensor in tensors.items():
            assert f.get_tensor(name).dtype == torch.float16
            assert torch.equal(f.get_tensor(name), tensor.to(torch.float16))
