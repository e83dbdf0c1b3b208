"""PyTorch FSDP2 training step at shardlm's shapes: the anchor every GPU speed claim of
shardlm is a ratio against (benchmarks/RESULTS.md). One configuration per process.

The model is transformers' LlamaForCausalLM with attn_implementation="sdpa" (what users of
torchtune and llama-recipes train), built from the same shape as shardlm's preset of the
same name (src/model/llama/presets.c: vocabulary 32000, untied embeddings, RMSNorm eps 1e-5, RoPE theta
10000, init std 0.02), fp32 master weights, `fully_shard` on every decoder layer and on
the root with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32);
FULL_SHARD = reshard_after_forward=True, SHARD_GRAD_OP = False. Optional full activation
checkpointing (checkpoint_wrapper, non-reentrant, per decoder layer) and torch.compile per
decoder layer. Optional float8 training (--float8, torchao's, as torchtitan applies it): every
nn.Linear of the decoder layers (q/k/v/o, gate/up/down; not the LM head, whose output
torchtitan also keeps in bf16) becomes torchao's Float8Linear by convert_to_float8_training
with Float8LinearConfig.from_recipe_name(RECIPE) before torch.compile and fully_shard:
"tensorwise" = dynamic per-tensor scales, e4m3 input and weight, e5m2 gradients; "rowwise" =
per-row scales, e4m3 everywhere, scales rounded down to powers of 2. --float8-all-gather
(tensorwise only, as torchao allows) makes FSDP2 all-gather the weights in float8 with their
scales precomputed after each optimizer step (precompute_float8_dynamic_scale_for_fsdp). On
--device cpu the recipe is emulated (torchao's emulate=True: the float8 casts, then the
matmuls in high precision). torchao is not a dependency of the rest: the GPU suite installs
its wheel when a --float8 run needs it (benchmarks/gpu_suite.sh, phase fp8). The optimizer
is shardlm's: AdamW lr 3e-4, betas (0.9, 0.95), eps 1e-8, decoupled weight decay 0.1 on
matrices only (norm weights undecayed), global-norm clipping at 1.0 (jobs/llama2-7b.ini);
fused when torch accepts it, else foreach. Data: random tokens, labels = inputs (the HF
causal-LM loss shifts them). --grad-accum K: K micro-batches a step, each loss divided by K
before its backward (FSDP2 reduce-scatters each one's gradients, as torchtitan's
accumulation does), then one clip and one optimizer step, as shardlm's train.global_batch =
K x micro_batch x ranks.

--lora R: LoRA as llama-recipes' use_peft and torchtune's lora recipes run it under FSDP:
Hugging Face PEFT's get_peft_model(LoraConfig(r=R, lora_alpha=2R, lora_dropout=0,
target_modules=the seven projections)) before fully_shard; the frozen base stored in bf16
(shardlm's fsdp.param_dtype for a frozen base), the adapters in fp32 (bf16 in the products by
the same MixedPrecisionPolicy), AdamW and clipping over the adapters alone. PEFT (and the
accelerate it imports) from PYTHONPATH when python lacks them.

Metric (shardlm's, src/watch/metrics.c): a step is timed from a device synchronisation to the
loss on the host; the slowest rank's time of each step counts; the mean over the steps
after --warmup. tokens/s/GPU = grad_accum x micro_batch x seq / step. FLOPs/token = 6 N + 12 L d T
(N = all parameters, L layers, d model width, T sequence length); TFLOP/s/GPU = FLOPs/token
x tokens/s/GPU; MFU = TFLOP/s/GPU / peak, peak 989 TFLOP/s = the dense bf16 Tensor Core
rate of an H100 or H200 SXM (NVIDIA's datasheets give 1,979 TFLOP/s "with sparsity", twice
the dense rate). Memory: device memory in use (total - free, as shardlm's mem_peak_bytes
and nvidia-smi count it) after each step, the largest over steps and ranks; also
torch.cuda's peak allocated and reserved.

Usage:
  torchrun --standalone --nproc-per-node=G benchmarks/anchor/torch_fsdp2.py \
      --model llama2-7b --micro-batch 2 [--grad-accum 1] [--seq 4096] \
      [--strategy FULL_SHARD|SHARD_GRAD_OP] \
      [--ac none|full] [--compile] [--float8 tensorwise|rowwise [--float8-all-gather]]
      [--lora R]
      [--warmup 3] [--steps 5] [--json FILE]
  python3 benchmarks/anchor/torch_fsdp2.py --model tiny --device cpu   # one process, gloo
  python3 benchmarks/anchor/torch_fsdp2.py --model llama2-7b --count   # shape only, no step
Output (rank 0): the configuration, one line per step, a result line, then one JSON line
(also appended to --json FILE). Exit status: 0; 1 when a step runs out of memory (the rank
that did prints the JSON line, with "error", and leaves at once); 2 bad usage.
"""
import argparse
import json
import os
import resource
import socket
import sys
import time

# shardlm's presets (src/model/llama/presets.c): dim, layers, heads, kv heads, ffn, vocab, and the
# sequence length of its job file (jobs/NAME.ini)
MODELS = {
    "tiny": dict(dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=352, vocab=256, seq=128),
    "tinyllama-1b": dict(dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, ffn_dim=5632,
                         vocab=32000, seq=2048),
    "llama2-7b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_dim=11008,
                      vocab=32000, seq=4096),
    "llama2-13b": dict(dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, ffn_dim=13824,
                       vocab=32000, seq=4096),
}
PEAK_TFLOPS = 989.0
FLOAT8_RECIPES = ["tensorwise", "rowwise"]  # Float8LinearRecipeName values the anchor runs
LR, BETAS, EPS, WEIGHT_DECAY, GRAD_CLIP = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0


def die(msg, code=2):
    print(f"torch_fsdp2: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: the job's)")
    ap.add_argument("--micro-batch", type=int, default=1, help="sequences per GPU per micro-batch")
    ap.add_argument("--grad-accum", type=int, default=1,
                    help="micro-batches per optimizer step (gradient accumulation)")
    ap.add_argument("--strategy", choices=["FULL_SHARD", "SHARD_GRAD_OP"], default="FULL_SHARD")
    ap.add_argument("--ac", choices=["none", "full"], default="none",
                    help="activation checkpointing of every decoder layer")
    ap.add_argument("--compile", action="store_true", help="torch.compile every decoder layer")
    ap.add_argument("--float8", choices=FLOAT8_RECIPES, default=None,
                    help="torchao float8 training of the decoder layers' linear layers with this recipe")
    ap.add_argument("--float8-all-gather", action="store_true",
                    help="with --float8 tensorwise: FSDP2 all-gathers the weights in float8")
    ap.add_argument("--lora", type=int, default=0, metavar="R",
                    help="train LoRA adapters of rank R (PEFT) over a frozen bf16 base")
    ap.add_argument("--warmup", type=int, default=3, help="first steps left out of the means")
    ap.add_argument("--steps", type=int, default=5, help="timed steps after the warm-up")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: gloo and the CPU (checks the script, measures nothing useful)")
    ap.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS, help="MFU denominator")
    ap.add_argument("--json", default=None, help="append the JSON line to this file too")
    ap.add_argument("--name", default="", help="a label copied into the JSON line")
    ap.add_argument("--count", action="store_true",
                    help="build the model on the meta device, print its size and FLOPs/token, exit")
    a = ap.parse_args(argv)
    for k in ("micro_batch", "grad_accum", "steps"):
        if getattr(a, k) < 1:
            die(f"--{k.replace('_', '-')} must be >= 1")
    if a.warmup < 0 or (a.seq is not None and a.seq < 2) or a.peak_tflops <= 0:
        die("--warmup must be >= 0, --seq >= 2, --peak-tflops > 0")
    if a.float8_all_gather and a.float8 != "tensorwise":
        die("--float8-all-gather needs --float8 tensorwise (torchao gathers float8 weights "
            "with per-tensor scales only)")
    return a


def llama_config(shape, seq):
    from transformers import LlamaConfig
    kw = dict(hidden_size=shape["dim"], num_hidden_layers=shape["n_layers"],
              num_attention_heads=shape["n_heads"], num_key_value_heads=shape["n_kv_heads"],
              intermediate_size=shape["ffn_dim"], vocab_size=shape["vocab"],
              max_position_embeddings=seq, rms_norm_eps=1e-5, initializer_range=0.02,
              tie_word_embeddings=False, use_cache=False, attention_bias=False, mlp_bias=False)
    try:
        cfg = LlamaConfig(**kw, rope_theta=10000.0, attn_implementation="sdpa")
    except TypeError:  # a release without these keyword arguments
        cfg = LlamaConfig(**kw)
        cfg._attn_implementation = "sdpa"
    return cfg


def flops_per_token(n_params, shape, seq):
    return 6.0 * n_params + 12.0 * shape["n_layers"] * shape["dim"] * seq


def count_only(a, shape, seq):
    import torch
    import transformers
    from transformers import LlamaForCausalLM
    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(shape, seq))
    n = sum(p.numel() for p in model.parameters())
    out = dict(anchor="torch_fsdp2", model=a.model, n_params=n, seq=seq,
               flops_per_token=flops_per_token(n, shape, seq),
               attn=model.config._attn_implementation, transformers=transformers.__version__)
    print(json.dumps(out), flush=True)


def float8_text(a, n_float8, dev, torchao):
    """the header's words on the float8 recipe"""
    how = "emulated" if dev.type != "cuda" else "torchao " + torchao.__version__
    gather = ", float8 all-gather" if a.float8_all_gather else ""
    return f"float8 {a.float8} on {n_float8} linear layers ({how}{gather})"


def emit(result, path):
    """The JSON line on stdout and, with --json, appended to PATH."""
    line = json.dumps(result)
    print(line, flush=True)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def init_distributed(device):
    import torch.distributed as dist
    if "RANK" not in os.environ:  # one process without torchrun: a world of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    import torch
    if device == "cuda":
        if not torch.cuda.is_available():
            die("no CUDA device visible (use --device cpu to check the script on a CPU)")
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    return dist, rank, world, dev


def import_torchao():
    """torchao's float8 training API, or one error line saying how to get it"""
    try:
        import torchao
        from torchao.float8 import (Float8LinearConfig, convert_to_float8_training,
                                    precompute_float8_dynamic_scale_for_fsdp)
    except ImportError as e:
        die(f"--float8 needs torchao's float8 training ({e}); install its wheel with "
            "`python3 -m pip install --no-deps torchao` (benchmarks/gpu_suite.sh's fp8 phase "
            "installs the one under .gpu/wheels)", 1)
    return torchao, Float8LinearConfig, convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp


def float8_layers(a, model, dev):
    """Converts the decoder layers' nn.Linear modules to torchao's Float8Linear with the
    recipe of --float8 (before torch.compile and fully_shard wrap them, as torchtitan
    does); returns the number converted. The LM head stays bf16, and so does any linear
    whose dimensions are not multiples of 16 (the FP8 GEMMs' constraint)."""
    import dataclasses
    import torch
    _, Float8LinearConfig, convert, _ = import_torchao()
    config = Float8LinearConfig.from_recipe_name(a.float8)
    changes = {}
    if a.float8_all_gather:
        changes["enable_fsdp_float8_all_gather"] = True
    if dev.type != "cuda":
        changes["emulate"] = True
    if changes:
        config = dataclasses.replace(config, **changes)

    def wanted(mod, fqn):
        return (isinstance(mod, torch.nn.Linear) and fqn.startswith("model.layers.")
                and mod.in_features % 16 == 0 and mod.out_features % 16 == 0)
    before = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    convert(model, config=config, module_filter_fn=wanted)
    after = sum(type(m) is torch.nn.Linear for m in model.modules())
    return before - after


def build(a, shape, seq, dev):
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(llama_config(shape, seq))
    model = model.float()
    if model.config._attn_implementation != "sdpa":
        die(f"transformers chose attention '{model.config._attn_implementation}', not sdpa", 1)
    if model.lm_head.weight is model.model.embed_tokens.weight:
        die("the embedding and the LM head are tied; shardlm's are not", 1)
    n_float8 = float8_layers(a, model, dev) if a.float8 else 0
    if a.lora:
        from peft import LoraConfig, get_peft_model
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=a.lora, lora_alpha=2 * a.lora, lora_dropout=0.0,
                                                 target_modules=targets, task_type="CAUSAL_LM"))
        for p in model.parameters():
            if not p.requires_grad:
                p.data = p.data.to(torch.bfloat16)
        layers = model.base_model.model.model.layers
    else:
        layers = model.model.layers
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    reshard = a.strategy == "FULL_SHARD"
    for i, layer in enumerate(layers):
        if a.ac == "full":
            layer = checkpoint_wrapper(layer, preserve_rng_state=False)
        if a.compile:
            layer = torch.compile(layer)
        fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard)
        layers[i] = layer
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
    return model, n_float8


def make_optimizer(model, impl):
    import torch
    trained = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trained if p.ndim >= 2]
    no_decay = [p for p in trained if p.ndim < 2]
    groups = [dict(params=decay, weight_decay=WEIGHT_DECAY), dict(params=no_decay, weight_decay=0.0)]
    kw = dict(lr=LR, betas=BETAS, eps=EPS)
    if impl == "fused":
        return torch.optim.AdamW(groups, fused=True, **kw)
    return torch.optim.AdamW(groups, foreach=True, **kw)


def main(argv):
    a = parse_args(argv)
    shape = MODELS[a.model]
    seq = a.seq or shape["seq"]
    if a.count:
        count_only(a, shape, seq)
        return 0
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off, as the suite runs shardlm
    t_setup = time.perf_counter()
    import torch
    import transformers
    # torchao first: a missing one is an error before any process group or model exists
    torchao, _, _, precompute_scales = import_torchao() if a.float8 else (None,) * 4
    dist, rank, world, dev = init_distributed(a.device)
    model, n_float8 = build(a, shape, seq, dev)
    n_params = sum(p.numel() for p in model.parameters())
    fpt = flops_per_token(n_params, shape, seq)
    cuda = dev.type == "cuda"
    opt_impl = "fused" if cuda else "foreach"
    opt = make_optimizer(model, opt_impl)
    trained = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234 + rank)
    device_name = torch.cuda.get_device_name(dev) if cuda else "cpu"

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def device_used():
        if cuda:
            free, total = torch.cuda.mem_get_info(dev)
            return total - free
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def step():
        nonlocal opt, opt_impl
        loss_sum = 0.0
        for _ in range(a.grad_accum):
            x = torch.randint(0, shape["vocab"], (a.micro_batch, seq), device=dev, generator=gen)
            loss = model(input_ids=x, labels=x).loss / a.grad_accum
            loss.backward()
            loss_sum = loss_sum + loss.detach()
        # torchtitan's clipping for FSDP2: the total norm of the sharded gradients (a DTensor
        # until made whole), then every gradient scaled by min(1, clip / norm)
        if hasattr(torch.nn.utils, "get_total_norm"):
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads, 2.0, False, True)
            if hasattr(norm, "full_tensor"):
                norm = norm.full_tensor()
            torch.nn.utils.clip_grads_with_norm_(trained, GRAD_CLIP, norm, True)
        else:  # torch before 2.6
            norm = torch.nn.utils.clip_grad_norm_(trained, GRAD_CLIP, foreach=True)
        try:
            opt.step()
        except (RuntimeError, NotImplementedError) as e:
            if opt_impl != "fused" or "out of memory" in str(e):
                raise
            if rank == 0:
                print(f"# fused AdamW refused ({type(e).__name__}: {str(e)[:120]}); foreach instead",
                      flush=True)
            opt, opt_impl = make_optimizer(model, "foreach"), "foreach"
            opt.step()
        if a.float8_all_gather:  # the next all-gather's float8 scales, one pass for all weights
            precompute_scales(model)
        opt.zero_grad(set_to_none=True)
        return float(loss_sum), float(norm)

    header = (f"# torch_fsdp2: {a.model} ({n_params:,} parameters), seq {seq}, "
              f"micro-batch {a.micro_batch} x {a.grad_accum} accumulated, {world} x {device_name}, "
              f"{a.strategy}, ac {a.ac}, {f'LoRA r {a.lora} (PEFT), ' if a.lora else ''}"
              f"{'torch.compile per layer' if a.compile else 'eager'}, bf16 params / fp32 reduce, "
              f"{float8_text(a, n_float8, dev, torchao) if a.float8 else 'matmuls bf16'}, "
              f"attention {model.config._attn_implementation}; torch {torch.__version__}, "
              f"transformers {transformers.__version__}")
    if rank == 0:
        print(header, flush=True)
        print("#  step  loss(rank0)   grad_norm     step_ms", flush=True)
    result = dict(anchor="torch_fsdp2", name=a.name, model=a.model, n_params=n_params, lora=a.lora,
                  n_layers=shape["n_layers"], dim=shape["dim"], seq=seq,
                  micro_batch=a.micro_batch, grad_accum=a.grad_accum,
                  world=world, strategy=a.strategy, ac=a.ac, compile=a.compile,
                  device=dev.type, device_name=device_name, param_dtype="bf16", reduce_dtype="fp32",
                  attn=model.config._attn_implementation, lr=LR, betas=list(BETAS), eps=EPS,
                  weight_decay=WEIGHT_DECAY, grad_clip=GRAD_CLIP, warmup=a.warmup, steps=a.steps,
                  flops_per_token=fpt, peak_tflops=a.peak_tflops, torch=torch.__version__,
                  transformers=transformers.__version__, float8=a.float8,
                  float8_all_gather=a.float8_all_gather, float8_linears=n_float8,
                  float8_emulated=bool(a.float8) and not cuda,
                  torchao=torchao.__version__ if a.float8 else None,
                  nccl=".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
                  nccl_nvls_enable=os.environ.get("NCCL_NVLS_ENABLE"))
    OutOfMemory = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    times, losses, norms, mem_peak = [], [], [], 0
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    dist.barrier()
    for s in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        try:
            loss, norm = step()
        except OutOfMemory as e:
            # the other ranks wait in a collective this rank will never join: report from
            # here and leave at once (torchrun then stops the rest)
            result.update(error=f"out of memory at step {s + 1} on rank {rank}: "
                          + str(e).split("\n")[0][:200], optimizer=f"AdamW({opt_impl})",
                          losses=losses, step_ms=times)
            print(f"torch_fsdp2: error: {result['error']}", file=sys.stderr, flush=True)
            emit(result, a.json)
            os._exit(1)
        times.append(1000.0 * (time.perf_counter() - t0))
        losses.append(loss)
        norms.append(norm)
        mem_peak = max(mem_peak, device_used())
        if rank == 0:
            print(f"  {s + 1:5d} {loss:11.6f} {norm:11.4f} {times[-1]:11.1f}", flush=True)
    # the slowest rank's time of each step, the largest memory of any rank
    stats = torch.tensor(times + [float(mem_peak)], dtype=torch.float64, device=dev)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    step_ms = stats[:-1].tolist()
    timed = step_ms[a.warmup:]
    mean = sum(timed) / len(timed)
    tps = a.grad_accum * a.micro_batch * seq / (mean / 1000.0)
    tflops = fpt * tps / 1e12
    result.update(optimizer=f"AdamW({opt_impl})", step_ms=step_ms, losses=losses, grad_norms=norms,
                  step_ms_mean=mean, step_ms_min=min(timed), step_ms_max=max(timed),
                  tokens_per_s_per_gpu=tps, tflops_per_gpu=tflops, mfu=tflops / a.peak_tflops,
                  mem_peak_bytes=int(stats[-1].item()), mem_allocated_peak_bytes=None,
                  mem_reserved_peak_bytes=None, setup_and_run_s=time.perf_counter() - t_setup)
    if cuda:  # every rank's allocator peaks, reduced like the rest
        m = torch.tensor([torch.cuda.max_memory_allocated(dev), torch.cuda.max_memory_reserved(dev)],
                         dtype=torch.float64, device=dev)
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        result["mem_allocated_peak_bytes"], result["mem_reserved_peak_bytes"] = map(int, m.tolist())
    if rank == 0:
        gib = 2.0 ** 30
        alloc = (f", allocated {result['mem_allocated_peak_bytes'] / gib:.1f} GiB, reserved "
                 f"{result['mem_reserved_peak_bytes'] / gib:.1f} GiB" if cuda else "")
        print(f"# result: {tps:,.0f} tokens/s/GPU, {tflops:.1f} TFLOP/s/GPU, MFU "
              f"{100 * result['mfu']:.1f}% (peak {a.peak_tflops:g}), step {mean:.1f} ms (mean of "
              f"steps {a.warmup + 1}..{a.warmup + a.steps}; {min(timed):.1f}-{max(timed):.1f}), "
              f"device memory {result['mem_peak_bytes'] / gib:.1f} GiB{alloc}, {result['optimizer']}",
              flush=True)
        emit(result, a.json)
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
