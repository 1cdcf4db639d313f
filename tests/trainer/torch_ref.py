# SPDX-License-Identifier: Apache-2.0
#
# torch_ref.py - an independent PyTorch (float64) reference of loom-train's GPT, to check the
# loss and the gradients that loom-train computes (in float32, in any parallel layout).
#
# The model, written here from its description and not from loom's C code: byte vocabulary
# V = 256; x = wte[tok] + wpe[pos]; L pre-LayerNorm blocks, each
#   h = LN1(x); q, k, v = h wq, h wk, h wv; H causal softmax heads of width C/H, scale 1/sqrt(hd);
#   x2 = x + att wo; x3 = x2 + gelu_tanh(LN2(x2) wup) wdown;
# then logits = LNf(x_L) wte^T (the head is tied to the token embedding) and the loss is the mean
# cross-entropy over all B*T tokens. LayerNorms have eps 1e-5, a weight and a bias; linear layers
# have no bias and store their weight as [in][out].
#
# Inputs, all written by loom-train (one process or many, the files are the same):
# They describe the first step of a loom-train run: step 1, or the step a resumed run starts at.
#   --params     the global parameter vector before it (--dump-params of --steps 0, or of the run
#                that saved the checkpoint): float32 LE,
#                wte[V][C], wpe[T][C], per layer ln1.w ln1.b wq wk wv wo ln2.w ln2.b wup wdown,
#                then lnf.w lnf.b
#   --batch-file that step's global batch (--dump-batch): B*T token bytes, then B*T target bytes
#   --grads      its reduced gradient of the mean loss (--dump-grads), same layout as params
#   --log        loom-train's --log-json: the first step line holds that step's loss
# Checks: loss relative error <= 1e-6 and, per tensor, ||g_loom - g_ref|| / ||g_ref|| <= 1e-4.
# Exit 0 on PASS, 1 on FAIL, 77 (SKIP) when torch cannot be imported.
#
#   python3 tests/trainer/torch_ref.py --layers 2 --d 32 --heads 4 --ctx 16 --batch 8 \
#       --params p0.bin --batch-file b.bin --grads g.bin --log log.json
import argparse
import array
import json
import math
import os
import sys

VOCAB = 256
LN_EPS = 1e-5
BLOCK_TENSORS = ("ln1.w", "ln1.b", "wq", "wk", "wv", "wo", "ln2.w", "ln2.b", "wup", "wdown")


def fail(msg):
    print(f"torch reference: FAIL: {msg}")
    sys.exit(1)


def layout(L, C, T):
    """[(name, shape)] of the global parameter vector, in order."""
    out = [("wte", (VOCAB, C)), ("wpe", (T, C))]
    shapes = {"ln1.w": (C,), "ln1.b": (C,), "wq": (C, C), "wk": (C, C), "wv": (C, C),
              "wo": (C, C), "ln2.w": (C,), "ln2.b": (C,), "wup": (C, 4 * C), "wdown": (4 * C, C)}
    for layer in range(L):
        out += [(f"h{layer}.{n}", shapes[n]) for n in BLOCK_TENSORS]
    out += [("lnf.w", (C,)), ("lnf.b", (C,))]
    return out


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def read_floats(path, count, what):
    try:
        size = os.path.getsize(path)
    except OSError as e:
        fail(f"cannot read {what} {path}: {e.strerror}")
    if size != 4 * count:
        fail(f"{what} {path} has {size} bytes, the configuration needs {4 * count} "
             f"({count} float32 values): wrong --layers/--d/--ctx, or a file from another run?")
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a


def read_log_loss(path):
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        fail(f"cannot read the log {path}: {e.strerror}")
    for i, line in enumerate(lines):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            fail(f"{path}:{i + 1} is not a JSON line")
        if isinstance(rec, dict) and "step" in rec and "loss" in rec:
            return float(rec["loss"])
    fail(f"{path} has no line with a \"step\" and a \"loss\"")


def main():
    ap = argparse.ArgumentParser(description="PyTorch float64 reference of loom-train's loss "
                                             "and gradients")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--d", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--ctx", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--params", required=True, help="initial parameters (--dump-params)")
    ap.add_argument("--batch-file", required=True, help="step 1's batch (--dump-batch)")
    ap.add_argument("--grads", required=True, help="step 1's reduced gradient (--dump-grads)")
    ap.add_argument("--log", required=True, help="loom-train's --log-json output")
    ap.add_argument("--loss-tol", type=float, default=1e-6, help="loss relative error bound")
    ap.add_argument("--grad-tol", type=float, default=1e-4,
                    help="per-tensor relative L2 gradient error bound")
    a = ap.parse_args()
    L, C, H, T, B = a.layers, a.d, a.heads, a.ctx, a.batch
    if min(L, C, H, T, B) < 1 or C % H:
        fail(f"bad configuration L{L} C{C} H{H} T{T} B{B}: all must be >= 1 and H must divide C")

    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # ImportError, or a broken installation
        print(f"torch reference: SKIP: cannot import torch ({e.__class__.__name__}: {e}) "
              f"with {sys.executable}")
        sys.exit(77)

    torch.set_default_dtype(torch.float64)
    tensors = layout(L, C, T)
    total = sum(numel(s) for _, s in tensors)
    pvec = read_floats(a.params, total, "the parameter file")
    gvec = read_floats(a.grads, total, "the gradient file")
    try:
        bsize = os.path.getsize(a.batch_file)
    except OSError as e:
        fail(f"cannot read the batch file {a.batch_file}: {e.strerror}")
    if bsize != 2 * B * T:
        fail(f"the batch file {a.batch_file} has {bsize} bytes, the configuration needs "
             f"{2 * B * T} (B {B} x T {T} tokens, then as many targets): wrong --batch/--ctx?")
    with open(a.batch_file, "rb") as f:
        raw = f.read()
    loom_loss = read_log_loss(a.log)

    # float32 -> float64 exactly; one leaf tensor per parameter.
    P, G, off = {}, {}, 0
    p_all = torch.tensor(pvec, dtype=torch.float64)
    g_all = torch.tensor(gvec, dtype=torch.float64)
    for name, shape in tensors:
        n = numel(shape)
        P[name] = p_all[off:off + n].reshape(shape).clone().requires_grad_(True)
        G[name] = g_all[off:off + n].reshape(shape)
        off += n
    assert off == total
    tok = torch.tensor(list(raw[:B * T]), dtype=torch.long).reshape(B, T)
    tgt = torch.tensor(list(raw[B * T:]), dtype=torch.long).reshape(B, T)

    def layernorm(x, w, b):
        mu = x.mean(dim=-1, keepdim=True)
        var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)  # biased, as LayerNorm is
        return (x - mu) / torch.sqrt(var + LN_EPS) * w + b

    def gelu_tanh(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    hd = C // H
    causal = torch.ones(T, T, dtype=torch.bool).tril()  # query i sees keys j <= i

    def attention(h, p):
        q, k, v = h @ p["wq"], h @ p["wk"], h @ p["wv"]  # [B][T][C]

        def split(t):  # [B][T][C] -> [B][H][T][hd]: head i is columns [i*hd, (i+1)*hd)
            return t.reshape(B, T, H, hd).transpose(1, 2)

        q, k, v = split(q), split(k), split(v)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        s = s.masked_fill(~causal, float("-inf"))
        o = torch.softmax(s, dim=-1) @ v  # [B][H][T][hd]
        return o.transpose(1, 2).reshape(B, T, C) @ p["wo"]

    x = P["wte"][tok] + P["wpe"][torch.arange(T)].unsqueeze(0)
    for layer in range(L):
        p = {n: P[f"h{layer}.{n}"] for n in BLOCK_TENSORS}
        x = x + attention(layernorm(x, p["ln1.w"], p["ln1.b"]), p)
        h2 = layernorm(x, p["ln2.w"], p["ln2.b"])
        x = x + gelu_tanh(h2 @ p["wup"]) @ p["wdown"]
    hf = layernorm(x, P["lnf.w"], P["lnf.b"])
    logits = hf @ P["wte"].t()  # tied head
    loss = F.cross_entropy(logits.reshape(B * T, VOCAB), tgt.reshape(B * T), reduction="mean")
    loss.backward()

    ok = True
    ref_loss = loss.item()
    loss_err = abs(loom_loss - ref_loss) / abs(ref_loss)
    if not loss_err <= a.loss_tol:
        ok = False
    print(f"loss: loom {loom_loss:.9g} reference {ref_loss:.12g} rel error {loss_err:.3e}"
          f"{'' if loss_err <= a.loss_tol else '  FAIL'}")

    worst_name, worst, worst_rank = None, 0.0, -1.0
    for name, shape in tensors:
        ref = P[name].grad
        got = G[name]
        rn = ref.norm().item()
        dn = (got - ref).norm().item()
        if rn > 0:
            err = dn / rn
        else:
            err = 0.0 if dn == 0 else float("inf")
        if not math.isfinite(dn):
            err = float("nan")
        bad = not err <= a.grad_tol
        if bad:
            ok = False
        rank = math.inf if math.isnan(err) else err  # a NaN is the worst there is
        if worst_name is None or rank > worst_rank:
            worst_name, worst, worst_rank = name, err, rank
        print(f"  {name:<12} {'x'.join(map(str, shape)):>9}  |ref| {rn:.4e}  rel error "
              f"{err:.3e}{'  FAIL' if bad else ''}")
    cfg = f"L{L} C{C} H{H} T{T} B{B}"
    summary = (f"{cfg}: loss rel error {loss_err:.3e} (<= {a.loss_tol:g}), worst gradient "
               f"{worst_name} rel error {worst:.3e} (<= {a.grad_tol:g}) over {len(tensors)} "
               f"tensors")
    print(f"torch reference: {'PASS' if ok else 'FAIL'} {summary}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
