"""Pushes from PyTorch tensors, ml_dtypes bfloat16 arrays and safetensors' own loaders (none of
them in requirements.txt: this file runs where they are installed, e.g. a trainer's venv with
the project's packages on PYTHONPATH, and skips elsewhere). CPU tensors, bf16, a transposed
(non-contiguous) view and a safe_open handle; the workers must hold exactly the pushed values."""

import numpy as np
import pytest

import rltest

torch = pytest.importorskip("torch")


def digests(c):
    return dict(c.weights_checker("checksum").workers[0].result.tensor_sha256)


def test_torch_bf16_ml_dtypes_and_safetensors(fleet2, tmp_path):
    from rlfleet import Client, read_safetensors, tensor_sha256
    ck = read_safetensors(rltest.STORIES)
    base = {n: torch.from_numpy(np.array(ck[n])) for n in ck}
    with Client(fleet2.address) as c:
        pushed = {n: t + 0.01 for n, t in base.items()}
        # A transposed view of a square tensor: non-contiguous, streamed block by block.
        sq = next(n for n, t in pushed.items() if t.dim() == 2 and t.shape[0] == t.shape[1])
        pushed[sq] = pushed[sq].t().contiguous().t()  # the same values, column-major
        assert not pushed[sq].is_contiguous()
        c.update_weights_from_tensor(pushed.items(), chunk_bytes=8 << 10)
        got = digests(c)
        for n, t in pushed.items():
            assert got[n] == tensor_sha256(n, t.contiguous().numpy()), n
        # bf16 torch tensors: the float32 workers hold them widened.
        bf = {n: (t * 1.5).to(torch.bfloat16) for n, t in base.items()}
        c.update_weights_from_tensor(list(bf.items()))
        got = digests(c)
        for n, t in bf.items():
            assert got[n] == tensor_sha256(n, t.float().numpy()), n
        # ml_dtypes bfloat16 NumPy arrays.
        ml_dtypes = pytest.importorskip("ml_dtypes")
        ml = {n: (np.array(ck[n]) * 0.5).astype(ml_dtypes.bfloat16) for n in ck}
        c.update_weights_from_tensor(ml)
        got = digests(c)
        for n, t in ml.items():
            assert got[n] == tensor_sha256(n, t.astype(np.float32)), n
        # safetensors' own loaders: a safe_open handle (tensors read one at a time).
        safetensors_torch = pytest.importorskip("safetensors.torch")
        from safetensors import safe_open
        path = tmp_path / "w.safetensors"
        safetensors_torch.save_file({n: t * 2 for n, t in base.items()}, str(path))
        with safe_open(str(path), framework="pt") as f:
            c.update_weights_from_tensor(f)
        got = digests(c)
        for n, t in base.items():
            assert got[n] == tensor_sha256(n, (t * 2).numpy()), n
