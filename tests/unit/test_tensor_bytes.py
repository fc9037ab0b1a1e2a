"""trainer.tensor_bytes writes what the safetensors library reads back, exactly."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load

from trainer import tensor_bytes
from trainer.state import safetensors_metadata


def test_every_dtype_and_shape_reads_back_equal_through_the_library():
    tensors = {"a": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16), "c": torch.tensor(3.0),
               "d": torch.zeros(0), "e": torch.arange(7, dtype=torch.int8), "f": torch.ones(2, dtype=torch.bool),
               "g": torch.randn(4, 4).t(), "h": torch.arange(9, dtype=torch.uint8).reshape(3, 3)}
    data = tensor_bytes.dumps(tensors, metadata={"version": "3"})
    back = load(data)
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape and torch.equal(back[name], t), name
    assert safetensors_metadata(data) == {"version": "3"}
    assert int.from_bytes(data[:8], "little") % tensor_bytes.ALIGNMENT == 0


def test_a_dtype_or_metadata_it_cannot_write_is_named():
    with pytest.raises(ValueError, match="'z'.*complex"):
        tensor_bytes.dumps({"z": torch.zeros(2, dtype=torch.complex64)})
    with pytest.raises(ValueError, match=r"metadata\['n'\]"):
        tensor_bytes.dumps({"a": torch.zeros(1)}, metadata={"n": 3})
