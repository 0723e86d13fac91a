#!/usr/bin/env python3
"""A simulated Hugging Face-style trainer: no GPU, no PyTorch, plain Python 3.

It takes the usual Trainer flags, "uses" memory according to a simple model, and
when that exceeds the simulated GPU it dies exactly like a real PyTorch 2.x run:
a traceback ending in `torch.OutOfMemoryError: CUDA out of memory. ...` and exit 1.
It saves and resumes real-shaped `checkpoint-N/trainer_state.json` folders, so
oomguard can be tried end to end on any machine:

    demo=$(mktemp -d) && oomguard python3 examples/sim_trainer.py \
        --per_device_train_batch_size 16 --gradient_accumulation_steps 2 \
        --max_seq_length 1024 --output_dir "$demo/out" --max_steps 30 --save_steps 5

(a fresh private folder: a fixed one under /tmp would belong to whoever ran
the demo first on a shared server).

Memory model (GiB): model_gib + micro_batch * seq_len * gib_per_sample_token,
with the activation part x0.4 under gradient checkpointing. With the defaults
(24 GiB GPU, 2 GiB model, 0.004) micro-batch 16 and 8 OOM at seq 1024, 4 fits.
A run that does not fit dies at step --oom_at_step (default 7), after checkpoint-5
is saved, so the relaunch visibly resumes. final.json records the steps each
launch contributed and the global batch it used.
"""
import argparse
import json
import os
import signal
import struct
import sys
import time
import traceback

CHECKPOINTING_FACTOR = 0.4  # activations kept with gradient checkpointing
CUDA_CONTEXT_GIB = 0.5      # "non-PyTorch memory": the CUDA context
GIB, MIB = 1024 ** 3, 1024 ** 2


def str2bool(v):
    if v.lower() in ("true", "1", "yes"):
        return True
    if v.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {v!r}")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--max_seq_length", type=int, default=512)
    p.add_argument("--gradient_checkpointing", type=str2bool, nargs="?", const=True, default=False)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--save_steps", type=int, default=10)
    p.add_argument("--max_steps", type=int, default=30)
    p.add_argument("--resume_from_checkpoint", default=None)
    p.add_argument("--step_seconds", type=float, default=0.02)
    p.add_argument("--capacity_gib", type=float, default=float(os.environ.get("SIM_CAPACITY_GIB", 24)))
    p.add_argument("--gib_per_sample_token", type=float,
                   default=float(os.environ.get("SIM_GIB_PER_SAMPLE_TOKEN", 0.004)))
    p.add_argument("--model_gib", type=float, default=2.0)
    p.add_argument("--oom_at_step", type=int, default=7,
                   help="a run that does not fit dies at the first step >= this one")
    p.add_argument("--deepspeed", default=None,
                   help="a DeepSpeed JSON config: its ZeRO stage shards the model's states over the "
                        "ranks, and checkpoints hold that stage's files (global_stepN/), read back "
                        "on resume as DeepSpeed reads them: a stage reads only its own")
    p.add_argument("--dataloader_num_workers", type=int, default=0)
    p.add_argument("--host_workers", type=int,
                   default=int(os.environ["SIM_HOST_WORKERS"]) if "SIM_HOST_WORKERS" in os.environ else None,
                   help="the most DataLoader workers the host's memory holds: with more, the run dies "
                        "of a host (CPU) OOM at --oom_at_step (default: any number fits)")
    p.add_argument("--disable_tqdm", type=str2bool, nargs="?", const=True, default=False,
                   help="print the Trainer's log dicts ({'loss': ..., 'epoch': ...}, no step in them) "
                        "every --logging_steps steps instead of a progress line per step")
    p.add_argument("--logging_steps", type=int, default=1)
    # Test-only behaviours.
    p.add_argument("--hang_after_oom", action="store_true", help="print the OOM, then hang (like NCCL)")
    p.add_argument("--fail_with", type=int, default=None, help="die of a non-OOM error with this code")
    p.add_argument("--die_while_saving_at", type=int, default=None, help="SIGKILL self mid-save of checkpoint-N")
    p.add_argument("--oom_while_saving_at", type=int, default=None,
                   help="a run that does not fit OOMs half-way through saving checkpoint-N")
    p.add_argument("--print_signals", action="store_true", help="print each signal received")
    p.add_argument("--oom_rank", type=int, default=None,
                   help="only this rank OOMs; the others wait at that step for the dead peer, "
                        "then fail with gloo's 'Connection closed by peer'")
    p.add_argument("--peer_wait", type=float, default=2.0,
                   help="how long the other ranks wait for the OOM rank before that error "
                        "(a long one: they hang in the collective, as NCCL does without a timeout)")
    return p.parse_args()


def rank():
    """This process's rank: torchrun's RANK, else Slurm's SLURM_PROCID."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0)))


def fmt(nbytes):
    """Format a size the way PyTorch's OOM message does (c10 format_size)."""
    if nbytes < 1024:
        return f"{nbytes:.0f} bytes"
    if nbytes < MIB:
        return f"{nbytes / 1024:.2f} KiB"
    if nbytes < GIB:
        return f"{nbytes / MIB:.2f} MiB"
    return f"{nbytes / GIB:.2f} GiB"


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError; tracebacks print it under that name."""


OutOfMemoryError.__module__ = "torch"


def oom_message(args, need_gib):
    """The text of a PyTorch 2.x CUDA OOM, with numbers from the memory model."""
    total = args.capacity_gib * GIB
    free = total * 0.05                        # a little is always left free
    in_use = total - free                      # what this process holds
    reserved_unalloc = min(912 * MIB, in_use / 10)
    allocated = in_use - reserved_unalloc - CUDA_CONTEXT_GIB * GIB
    tried = max((need_gib * GIB - in_use) / 4, free + 2 * MIB)  # one chunk of the rest
    gpu = int(os.environ.get("LOCAL_RANK", 0))
    return (f"CUDA out of memory. Tried to allocate {fmt(tried)}. GPU {gpu} has a total capacity of "
            f"{fmt(total)} of which {fmt(free)} is free. Including non-PyTorch memory, this process has "
            f"{fmt(in_use)} memory in use. Of the allocated memory {fmt(allocated)} is allocated by "
            f"PyTorch, and {fmt(reserved_unalloc)} is reserved by PyTorch but unallocated. If reserved "
            "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "to avoid fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def training_step(args, step, need_gib):
    """One optimizer step: fails the way a real one would, else returns a loss."""
    time.sleep(args.step_seconds)
    if step >= args.oom_at_step and args.fail_with is not None:
        raise RuntimeError("Expected all tensors to be on the same device, but found at least two "
                           "devices, cuda:0 and cpu!")
    if (step >= args.oom_at_step and args.host_workers is not None
            and args.dataloader_num_workers > args.host_workers):
        # What a DataLoader worker's batch costs the host, times too many workers.
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                           f"{args.dataloader_num_workers * 2 * GIB} bytes. Error code 12 "
                           "(Cannot allocate memory)")
    if step >= args.oom_at_step and need_gib > args.capacity_gib:
        if args.oom_rank is not None and args.oom_rank != rank():
            # A collective with a dead peer: gloo's error once the OOM rank is gone.
            print(f"rank {rank()}: waiting for a peer", flush=True)
            time.sleep(args.peer_wait)
            raise ConnectionError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                                  "Connection closed by peer [127.0.0.1]:29500")
        if args.oom_rank is not None:
            # Ranks run in lockstep: the others are at this step too before the OOM.
            time.sleep(1.0)
        raise OutOfMemoryError(oom_message(args, need_gib))
    return 4.0 / (1 + 0.1 * step)


def zero_config(path):
    """The ZeRO stage of a DeepSpeed JSON config (0 without one), and whether it
    offloads the optimizer's states to the CPU."""
    with open(path) as f:
        zero = json.load(f).get("zero_optimization", {})
    offload = zero.get("offload_optimizer", {}).get("device", "none") == "cpu"
    return int(zero.get("stage", 0)), offload


OPTIMIZER_SHARE = 0.75  # Adam's fp32 master weights and moments, of the model's states


def model_share(stage, world, offload=False):
    """The part of the model's states (weights and gradients, Adam's) one rank holds on
    its GPU: ZeRO 1-2 shard the optimizer's, ZeRO 3 all of them; an optimizer offloaded
    to the CPU holds none of its part on the GPU."""
    if stage is None or stage == 0:
        return 1.0
    rest = 1.0 - OPTIMIZER_SHARE
    optimizer = 0.0 if offload else OPTIMIZER_SHARE / world
    if stage < 3:
        return rest + optimizer
    return rest / world + optimizer


def zero_files(stage, world):
    """The files DeepSpeed (0.19) writes in global_stepN/ at this stage."""
    if stage == 0:
        return ["mp_rank_00_model_states.pt"]
    optim = [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(world)]
    if stage < 3:
        return ["mp_rank_00_model_states.pt"] + optim
    return [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(world)] + optim


def load_zero_checkpoint(ckpt, stage):
    """What DeepSpeed's load_checkpoint reads at this stage, failing as it fails when the
    checkpoint was written at a stage that keeps other files."""
    with open(os.path.join(ckpt, "latest")) as f:
        tag_dir = os.path.join(ckpt, f.read().strip())
    r = rank()
    if stage == 3:
        ckpt_list = [p for p in [os.path.join(tag_dir, f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")]
                     if os.path.exists(p)]
        assert len(ckpt_list) > 0
        return
    needed = ["mp_rank_00_model_states.pt"]
    if stage > 0:
        needed.append(f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    for name in needed:
        path = os.path.join(tag_dir, name)
        if not os.path.exists(path):
            raise FileNotFoundError(2, "No such file or directory", path)


def write_atomic(path, data):
    """Write to a temporary name, then rename, so a reader never sees half a file."""
    tmp = path + ".tmp"
    with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)


def safetensors_bytes(step):
    """A small but real safetensors file: 8-byte little-endian header length,
    JSON header, tensor bytes (one float32 tensor holding the step)."""
    header = json.dumps({"__metadata__": {"format": "pt", "step": str(step)},
                         "w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    return struct.pack("<Q", len(header)) + header + struct.pack("<4f", step, 0, 0, 0)


def save_checkpoint(args, step, state, need_gib=0.0):
    """Save like HF: weights first, trainer_state.json last (its presence = complete)."""
    ckpt = os.path.join(args.output_dir, f"checkpoint-{step}")
    os.makedirs(ckpt, exist_ok=True)
    write_atomic(os.path.join(ckpt, "model.safetensors"), safetensors_bytes(step))
    if args.oom_while_saving_at == step and need_gib > args.capacity_gib:
        # Gathering the optimizer state for the save needs memory the run lacks.
        raise OutOfMemoryError(oom_message(args, need_gib))
    if args.die_while_saving_at == step:
        print(f"(simulated crash while saving checkpoint-{step})", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if args.stage is not None:
        tag = os.path.join(ckpt, f"global_step{step}")
        os.makedirs(tag, exist_ok=True)
        for name in zero_files(args.stage, args.world):
            write_atomic(os.path.join(tag, name), b"\0" * 64)
        write_atomic(os.path.join(ckpt, "latest"), f"global_step{step}")
    state["global_step"] = step
    write_atomic(os.path.join(ckpt, "trainer_state.json"), json.dumps(state, indent=2) + "\n")
    print(f"Saving model checkpoint to {ckpt}", flush=True)


def install_signal_printer():
    def handler(signum, _frame):
        print(f"received signal {signal.Signals(signum).name}", flush=True)
        signal.signal(signum, signal.SIG_DFL)  # then die of it as usual
        os.kill(os.getpid(), signum)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, handler)


def main():
    args = parse_args()
    if args.print_signals:
        install_signal_printer()
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", 1)))
    args.world = world
    args.stage, args.offload = zero_config(args.deepspeed) if args.deepspeed else (None, False)
    micro, accum, seq = args.per_device_train_batch_size, args.gradient_accumulation_steps, args.max_seq_length
    global_batch = micro * accum * world
    activations = micro * seq * args.gib_per_sample_token
    if args.gradient_checkpointing:
        activations *= CHECKPOINTING_FACTOR
    need_gib = args.model_gib * model_share(args.stage, world, args.offload) + activations

    print(f"micro batch: {micro}  grad accum: {accum}  world size: {world}  seq len: {seq}  "
          f"grad checkpointing: {args.gradient_checkpointing}")
    print(f"global batch: {global_batch}")
    print(f"memory needed: {need_gib:.2f} GiB of {args.capacity_gib:.2f} GiB", flush=True)
    if args.dataloader_num_workers:
        print(f"dataloader workers: {args.dataloader_num_workers}", flush=True)
    if args.stage is not None:
        print(f"ZeRO stage: {args.stage}  optimizer offloaded: {args.offload}", flush=True)

    # The state a checkpoint carries, in the shape of HF's trainer_state.json.
    # "oomguard_sim.segments" records which settings trained which steps.
    state = {"global_step": 0, "max_steps": args.max_steps, "save_steps": args.save_steps,
             "logging_steps": 1, "train_batch_size": micro, "epoch": 0.0, "log_history": [],
             "best_metric": None, "best_model_checkpoint": None, "is_hyper_param_search": False,
             "is_local_process_zero": True, "is_world_process_zero": True, "total_flos": 0,
             "trial_name": None, "trial_params": None,
             "oomguard_sim": {"micro": micro, "accum": accum, "world": world,
                              "global_batch": global_batch, "segments": []}}
    start = 0
    if args.resume_from_checkpoint:
        if args.stage is not None:
            try:
                load_zero_checkpoint(args.resume_from_checkpoint, args.stage)
            except (AssertionError, OSError):
                traceback.print_exc()
                sys.exit(1)
        with open(os.path.join(args.resume_from_checkpoint, "trainer_state.json")) as f:
            old = json.load(f)
        start = old["global_step"]
        state["log_history"] = old["log_history"]
        state["oomguard_sim"]["segments"] = old.get("oomguard_sim", {}).get("segments", [])
        print(f"resuming from {os.path.basename(os.path.normpath(args.resume_from_checkpoint))} "
              f"at step {start}", flush=True)
    segment = {"start_step": start, "end_step": start, "micro": micro, "accum": accum,
               "world": world, "global_batch": global_batch, "seq_len": seq,
               "gradient_checkpointing": args.gradient_checkpointing,
               "dataloader_num_workers": args.dataloader_num_workers,
               "zero_stage": args.stage, "offload_optimizer": args.offload,
               "resumed_from": args.resume_from_checkpoint}
    state["oomguard_sim"]["segments"].append(segment)
    os.makedirs(args.output_dir, exist_ok=True)

    tty = sys.stdout.isatty()
    t0 = time.time()
    def die(e):
        print("\n" if tty else "", end="", flush=True)  # end the progress bar's line
        traceback.print_exc()              # what Python prints for an uncaught error
        sys.stderr.flush()
        while isinstance(e, OutOfMemoryError) and args.hang_after_oom:
            time.sleep(3600)               # a rank stuck in a collective never exits
        sys.exit(args.fail_with if args.fail_with is not None else 1)

    for step in range(start + 1, args.max_steps + 1):
        try:
            loss = training_step(args, step, need_gib)
        except (RuntimeError, ConnectionError) as e:
            die(e)
        state["log_history"].append({"step": step, "loss": round(loss, 4), "epoch": step / args.max_steps})
        state["epoch"] = step / args.max_steps
        segment["end_step"] = step
        rate = (step - start) / max(time.time() - t0, 1e-9)
        pct = 100 * step // args.max_steps
        if args.disable_tqdm:
            # transformers 5's PrinterCallback: floats as 4 significant digits, no step.
            if step % args.logging_steps == 0:
                print({"loss": f"{loss:.4g}", "grad_norm": f"{1.0 / step:.4g}",
                       "learning_rate": "5e-05", "epoch": f"{step / args.max_steps:.4g}"}, flush=True)
        elif tty:   # tqdm-style bar redrawn in place
            bar = "#" * (pct // 10)
            print(f"\r{pct:3d}%|{bar:<10}| {step}/{args.max_steps} [{rate:.1f}it/s, loss={loss:.3f}]",
                  end="", flush=True)
        else:
            print(f"step {step}/{args.max_steps} loss={loss:.3f} global_batch={global_batch}", flush=True)
        if (step % args.save_steps == 0 or step == args.max_steps) and rank() == 0:
            if tty:
                print()
            try:
                save_checkpoint(args, step, state, need_gib)
            except RuntimeError as e:
                die(e)
    if tty:
        print()

    final = {"global_step": args.max_steps, "global_batch": global_batch,
             "micro": micro, "accum": accum, "world": world, "seq_len": seq,
             "dataloader_num_workers": args.dataloader_num_workers,
             "gradient_checkpointing": args.gradient_checkpointing,
             "attempts": state["oomguard_sim"]["segments"]}
    name = "final.json" if rank() == 0 else f"final-rank{rank()}.json"
    write_atomic(os.path.join(args.output_dir, name), json.dumps(final, indent=2) + "\n")
    print(f"training finished: global_step={args.max_steps} global_batch={global_batch}", flush=True)


if __name__ == "__main__":
    main()
