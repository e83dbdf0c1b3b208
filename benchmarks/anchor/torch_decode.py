"""Llama decode anchor: greedy generation of one sequence in PyTorch at shardlm's shapes,
the way the fastest plain-PyTorch generators run it (gpt-fast): bf16 weights, a static KV
cache of prompt + new tokens, the decode step compiled with torch.compile(mode=
"reduce-overhead", fullgraph=True) (Inductor's fused norms, RoPE and SwiGLU, replayed as a
CUDA graph), the prompt prefilled once without compiling. Random weights (std 0.02, as
shardlm's init), so the tokens are not compared with shardlm's; the speed does not depend
on them.

It also measures the machine's copy bandwidth (a device-to-device copy of 4 GiB, best of
10) and prints the decode bound of the shape: the bytes a step must read (every block
weight, the final norm and the output projection, one embedding row, and the KV cache up
to each position, averaged over the new tokens) over that bandwidth. A generator at the
bound streams the weights once per token and does nothing else.

Prints `anchor_decode tokens S seconds T tokens_per_s R`, `copy_gbs G`, `bound_tokens_per_s B`
(and `bytes_per_token N`), timed from the first decode step to the last token on the host
(after a compile/warm-up run of the same length that the timing leaves out).

  python3 torch_decode.py [--dim 4096 --layers 32 --heads 32 --kv-heads 32 --ffn 11008
                           --vocab 32000 --prompt 4 --tokens 256 --theta 10000] [--eager]
"""
import argparse
import time

import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--dim", type=int, default=4096)
ap.add_argument("--layers", type=int, default=32)
ap.add_argument("--heads", type=int, default=32)
ap.add_argument("--kv-heads", type=int, default=32)
ap.add_argument("--ffn", type=int, default=11008)
ap.add_argument("--vocab", type=int, default=32000)
ap.add_argument("--prompt", type=int, default=4)
ap.add_argument("--tokens", type=int, default=256)
ap.add_argument("--theta", type=float, default=10000.0)
ap.add_argument("--eager", action="store_true", help="no torch.compile (a CUDA graph only)")
a = ap.parse_args()

dev, dt = "cuda", torch.bfloat16
D, L, H, KV, Fd, V = a.dim, a.layers, a.heads, a.kv_heads, a.ffn, a.vocab
hd = D // H
cap = a.prompt + a.tokens
torch.manual_seed(0)


def w(*shape):
    return (torch.randn(*shape, device=dev, dtype=torch.float32) * 0.02).to(dt)


emb = w(V, D)
wqkv = [w((H + 2 * KV) * hd, D) for _ in range(L)]
wo = [w(D, H * hd) for _ in range(L)]
w13 = [w(2 * Fd, D) for _ in range(L)]
w2 = [w(D, Fd) for _ in range(L)]
n1 = [torch.ones(D, device=dev, dtype=dt) for _ in range(L)]
n2 = [torch.ones(D, device=dev, dtype=dt) for _ in range(L)]
norm = torch.ones(D, device=dev, dtype=dt)
head = w(V, D)
kc = [torch.zeros(1, KV, cap, hd, device=dev, dtype=dt) for _ in range(L)]
vc = [torch.zeros(1, KV, cap, hd, device=dev, dtype=dt) for _ in range(L)]
inv = 1.0 / (a.theta ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd))
ang = torch.outer(torch.arange(cap, device=dev, dtype=torch.float32), inv)
cos_t, sin_t = torch.cos(ang), torch.sin(ang)
causal = torch.tril(torch.ones(cap, cap, dtype=torch.bool, device=dev))


def rmsnorm(x, g):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dt) * g


def rope(x, pos):  # x (1, h, T, hd), rotate-half (Hugging Face's Llama)
    c = torch.cat([cos_t[pos]] * 2, -1)
    s = torch.cat([sin_t[pos]] * 2, -1)
    xf = x.float()
    x1, x2 = xf[..., : hd // 2], xf[..., hd // 2:]
    return (xf * c + torch.cat([-x2, x1], -1) * s).to(dt)


def step(tok, pos):  # tok (1, T) int64, pos (T,) int64: logits (V,) of the last token
    T = tok.shape[1]
    x = F.embedding(tok, emb)
    mask = causal[pos]
    for l in range(L):
        qkv = rmsnorm(x, n1[l]) @ wqkv[l].T
        q, k, v = qkv.split([H * hd, KV * hd, KV * hd], -1)
        q = rope(q.view(1, T, H, hd).transpose(1, 2), pos)
        k = rope(k.view(1, T, KV, hd).transpose(1, 2), pos)
        kc[l].index_copy_(2, pos, k)
        vc[l].index_copy_(2, pos, v.view(1, T, KV, hd).transpose(1, 2))
        o = F.scaled_dot_product_attention(q, kc[l], vc[l], attn_mask=mask, enable_gqa=KV != H)
        x = x + o.transpose(1, 2).reshape(1, T, H * hd) @ wo[l].T
        g, u = (rmsnorm(x, n2[l]) @ w13[l].T).chunk(2, -1)
        x = x + (F.silu(g) * u) @ w2[l].T
    return (rmsnorm(x[:, -1], norm) @ head.T).float()


if a.eager:
    graph, g_tok, g_pos, g_out = torch.cuda.CUDAGraph(), None, None, None

    def decode(tok, pos):
        global g_tok, g_pos, g_out
        if g_out is None:  # record once (after a warm-up on a side stream, as torch asks)
            g_tok, g_pos = tok.clone(), pos.clone()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                step(g_tok, g_pos)
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(graph):
                g_out = step(g_tok, g_pos)
        g_tok.copy_(tok)
        g_pos.copy_(pos)
        graph.replay()
        return g_out
else:
    decode = torch.compile(step, mode="reduce-overhead", fullgraph=True)


def generate():
    prompt = torch.tensor([[1] + list(range(450, 450 + a.prompt - 1))], device=dev)
    with torch.no_grad():
        logits = step(prompt, torch.arange(a.prompt, device=dev))
        tok = logits.argmax().view(1, 1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = [int(tok)]
        for i in range(a.tokens - 1):
            pos = torch.tensor([a.prompt + i], device=dev)
            tok = decode(tok, pos).argmax().view(1, 1)
            out.append(int(tok))  # on the host, as a generator that stops at an eos must
        return out, time.perf_counter() - t0


generate()  # compile and warm up
out, secs = generate()
n = len(out) - 1  # the decode steps timed
print(f"anchor_decode tokens {n} seconds {secs:.4f} tokens_per_s {n / secs:.2f}"
      f" ({'eager + CUDA graph' if a.eager else 'torch.compile reduce-overhead'}, torch {torch.__version__})")

src = torch.empty(1 << 31, dtype=dt, device=dev)  # 4 GiB
dst = torch.empty_like(src)
best = float("inf")
for _ in range(10):
    torch.cuda.synchronize()
    t = time.perf_counter()
    dst.copy_(src)
    torch.cuda.synchronize()
    best = min(best, time.perf_counter() - t)
copy_gbs = 2 * src.numel() * 2 / best / 1e9
weights = L * (wqkv[0].numel() + wo[0].numel() + w13[0].numel() + w2[0].numel() + 2 * D) + D + V * D + D
cache = 2 * L * KV * hd * (a.prompt + a.tokens / 2)  # per step, at the mean position
bytes_per_token = 2 * (weights + cache)
print(f"copy_gbs {copy_gbs:.1f}")
print(f"bytes_per_token {bytes_per_token:.0f}")
print(f"bound_tokens_per_s {copy_gbs * 1e9 / bytes_per_token:.2f}")
