"""One optimiser step (SFT or GRPO) per batch of trajectory-shaped records, the model resident.

Started by the TypeScript driver (src/backend/trainer.ts) as `run.py train --config JSON`: every
setting comes in that one object, declared with its default in src/backend/train-options.ts; nothing
is defaulted here. Input on stdin: one JSON record per line {prompt_ids, response_ids, loss_mask,
logprobs?, advantage?, advantages?}, already checked by the driver (checkTrainRecord), and a line
`{"end_batch": true, "lr"?: x, "step"?: n}` closing each batch. Each batch writes a checkpoint to
`out` (HF layout plus optimizer.safetensors with the AdamW moments and trainer_state.json with the
step count) and prints one Step record. End of input ends the process; records after the last
end_batch line are dropped (a step cut short is never trained).

Data parallel under torchrun: rank 0 reads the input and broadcasts each batch; rank r trains on
records r, r+W, ...; gradients are summed across ranks and every loss is divided by the batch's global
count of loss tokens, so W processes compute the same update as one. `dtype` (bf16/fp16 compute, fp32
master weights and AdamW state) and `shard` (FSDP2: parameters, gradients and moments split across the
ranks) are parallel.py's.

LoRA (`lora_rank`, or `lora_init`: a warm start from an adapter folder): lora.py wraps the target
linear layers before any sharding; the base is frozen and kept in the compute dtype, AdamW holds the
adapter's parameters only, and each checkpoint is an adapter folder in PEFT's format (plus the same
optimizer.safetensors, trainer_state.json and step.json) over the base `model`, which it names.
"""

import argparse
import datetime
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist

from . import lora as L
from . import parallel
from .checkpoint import (CheckpointError, SafetensorsFile, checkpoint_dtype, copy_tokenizer, load_model, replace_folder,
                         save_model, save_safetensors)
from .model import entropy_from_logits, token_logprobs
from .parallel import SetupError

STATE = "trainer_state.json"
MOMENTS = "optimizer.safetensors"
STEP_RECORD = "step.json"


class DataError(Exception):
    pass


def pick_device(name="auto"):
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():  # ROCm builds answer here too
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device(f"cuda:{local}")
    return torch.device("cpu")


def sequence(rec):
    """The trainer's view of one record (checked by the driver: nothing is validated here)."""
    adv = rec.get("advantage")
    return {"prompt": rec["prompt_ids"], "response": rec["response_ids"], "mask": rec["loss_mask"],
            "logprobs": rec.get("logprobs"), "advantage": float(adv) if adv is not None else 0.0,
            # per response token (advantage --step-weight): each turn's own advantage
            "advantages": rec.get("advantages")}


class Batch(list):
    """The records of one step, and what its end_batch line set: the learning rate and the step
    number (`{step}` in out and policy), or None."""

    lr = None
    step = None


def read_batches(stream):
    """Yields a Batch per end_batch line. An end_batch line may carry "lr", the learning rate of that
    step, so the process that feeds a resident trainer can own the schedule (e.g. decay over a
    wall-clock budget), and "step"; a numbered step is taken even when empty (every group had equal
    rewards): its checkpoint and Step record keep the run's numbering, and the engines their version.
    An empty batch without a step number is skipped. Records after the last end_batch are dropped."""
    batch = Batch()
    for line in stream:
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("end_batch") is True:
            if batch or rec.get("step") is not None:
                batch.lr = rec.get("lr")
                batch.step = rec.get("step")
                yield batch
                batch = Batch()
            continue
        batch.append(rec)


def seq_len(s):
    """Tokens of a sequence as the forward sees it: prompt then response."""
    return len(s["prompt"]) + len(s["response"])


def micro_batches(seqs, budget):
    """Greedy packing in length order: a micro-batch holds sequences while count * longest <= budget.

    Sorted, each micro-batch pads to a length close to its sequences' own. In input order one long
    sequence pads a whole micro-batch to its length, and the padded rows cost more than their share:
    attention is quadratic in the padded length, and without a fused kernel (torch < 2.0) it
    materialises (rows, heads, T, T) scores whose allocation alone dominated a step. The update is
    the same either way: every loss term is divided by the mini-batch's token count, whatever the split."""
    out, cur, longest = [], [], 0
    for s in sorted(seqs, key=seq_len):
        n = seq_len(s)
        if cur and (len(cur) + 1) * max(longest, n) > budget:
            out.append(cur)
            cur, longest = [], 0
        cur.append(s)
        longest = max(longest, n)
    if cur:
        out.append(cur)
    return out


def pack(mb, device, pad_id=0):
    """Right-padded inputs plus targets, masks and gather positions of the loss tokens only.

    Only tokens with loss_mask 1 get a logit: every loss term and metric is masked anyway, and the
    vocabulary projection (and its softmax) is the biggest cost of a small model, so tool responses
    and padding never reach it. Column j of the outputs is the j-th loss token of a sequence; the last
    value is each row's real length (the forward's `lengths`)."""
    lengths = [seq_len(s) for s in mb]
    T = max(lengths)
    keeps = []
    for s in mb:
        first = 0 if s["prompt"] else 1  # nothing predicts the first token of a prompt-less sequence
        keeps.append([j for j in range(first, len(s["response"])) if s["mask"][j]])
    R = max(1, max(len(k) for k in keeps))
    B = len(mb)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    pos = torch.zeros((B, R), dtype=torch.long)  # position of the logit that predicts loss token j
    tgt = torch.zeros((B, R), dtype=torch.long)
    mask = torch.zeros((B, R))
    rollout = torch.zeros((B, R))
    has_rollout = torch.zeros((B, R))
    adv = torch.zeros((B, R))  # per loss token: a record's `advantages`, else its one `advantage`
    for i, (s, keep) in enumerate(zip(mb, keeps)):
        p, r, k = len(s["prompt"]), len(s["response"]), len(keep)
        ids[i, :p + r] = torch.tensor(s["prompt"] + s["response"])
        if not k:
            continue
        at = torch.tensor(keep)
        pos[i, :k] = at + (p - 1)
        tgt[i, :k] = torch.tensor(s["response"])[at]
        mask[i, :k] = 1.0
        if s["logprobs"] is not None:
            rollout[i, :k] = torch.tensor(s["logprobs"], dtype=torch.float32)[at]
            has_rollout[i, :k] = 1.0
        if s.get("advantages") is not None:
            adv[i, :k] = torch.tensor(s["advantages"], dtype=torch.float32)[at]
        else:
            adv[i, :k] = s["advantage"]
    d = lambda t: t.to(device)
    return d(ids), d(pos), d(tgt), d(mask), d(rollout), d(has_rollout), d(adv), lengths


def response_logits(model, ids, pos, lengths):
    return model(ids, logits_at=pos, lengths=lengths)


def loss_tokens(s):
    """The loss tokens of a sequence (nothing predicts the first token of a prompt-less one)."""
    return sum(s["mask"][0 if s["prompt"] else 1:])


def pack_old(mb, shape, device):
    """The precomputed behaviour log-probs of a micro-batch, laid out as pack() lays out the targets."""
    old = torch.zeros(shape)
    for i, s in enumerate(mb):
        old[i, :len(s["old"])] = s["old"]
    return old.to(device)


def correction_weights(old, rollout, mask, mode, cap):
    """Rollout correction for the engine-vs-trainer mismatch: weights on the per-token loss.

    The engine samples with pi_rollout but the update is computed against pi_old (the trainer's
    log-probs of the same tokens); where the two differ (bf16 kernels, another engine, a lagging
    policy), each token is reweighted by the importance ratio pi_old / pi_rollout.
      token-tis  w = min(pi_old / pi_rollout, cap) per token (truncated IS, as verl/TRL offer)
      seq-mask   w = 0 for a whole sequence whose geometric-mean ratio lies outside [1/cap, cap]
    Tokens without rollout log-probs (mask 0) keep weight 1. Returns (weights, capped tokens,
    masked sequences)."""
    log_ratio = (old - rollout) * mask
    if mode == "token-tis":
        ratio = torch.exp(log_ratio)
        capped = (ratio > cap).float()
        w = torch.where(mask > 0, ratio.clamp(max=cap), torch.ones_like(ratio))
        return w.detach(), capped, 0
    n = mask.sum(-1)
    mean = log_ratio.sum(-1) / n.clamp(min=1)
    bad = (n > 0) & (mean.abs() > torch.log(torch.tensor(cap)))
    w = torch.where(bad.unsqueeze(-1), torch.zeros_like(old), torch.ones_like(old))
    return w.detach(), torch.zeros_like(old), int(bad.sum())


class Trainer:
    def __init__(self, args):
        self.args = args
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.device = pick_device(args.device)
        self.sharded = args.shard != "none"
        # before the process group starts and any checkpoint is read: a setup that cannot run says so
        self.dtype = parallel.check_setup(args.dtype, args.shard, self.device, self.world)
        if self.world > 1 or self.sharded:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            # RSTAR_DIST_TIMEOUT (seconds, default torch's 30 min): how long a collective may wait for
            # a rank that died or hangs, before this rank fails instead of waiting on
            timeout = datetime.timedelta(seconds=float(os.environ.get("RSTAR_DIST_TIMEOUT", "1800")))
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo", timeout=timeout)
        torch.manual_seed(args.seed)
        # The loss is divided by the batch's global count of loss tokens, so the update is the SUM of
        # the ranks' gradients (the data-parallel path all-reduces them so); sharded, FSDP2 reduces them
        # in the backward, and shard() says what the loss must be multiplied by for a sum.
        self.loss_scale = 1
        self.lora = lora_spec(args)  # None: full fine-tuning
        self.model = self.load(args.model)
        self.model.train()
        self.cfg = self.model.config
        self.scaler = parallel.grad_scaler(self.dtype)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if args.optimizer == "sgd":  # plain SGD: the update is lr * gradient, handy for exact comparisons
            self.opt = torch.optim.SGD(self.params, lr=args.lr, weight_decay=args.weight_decay)
        else:
            self.opt = torch.optim.AdamW(self.params, lr=args.lr, betas=(args.beta1, args.beta2),
                                         eps=args.eps, weight_decay=args.weight_decay)
        self.step_no = 0
        # LoRA: the base's optimizer state is not the adapter's; a warm start continues the adapter's own
        if self.lora is None:
            self.load_state(args.model)
        elif args.lora_init:
            self.load_state(args.lora_init)
        self.ref = None
        self.has_ref = args.kl_coef > 0
        # LoRA's reference is the base itself: the same model with its adapter switched off
        if self.has_ref and not (self.lora and os.path.abspath(args.ref or args.model) == os.path.abspath(args.model)):
            self.ref = self.load(args.ref or args.model, frozen=True)
            self.ref.eval()

    def load(self, folder, frozen=False):
        """A checkpoint as fp32 master weights on this rank's device, sharded across the ranks with --shard.

        LoRA: the base is frozen, so it needs no fp32 master copy: it is kept in the compute dtype (bf16
        with --dtype bf16), and only the adapter (fp32) trains. Sharded, the base stays fp32: FSDP2
        (torch < 2.10) refuses a group whose parameters differ in dtype ("FSDP expects uniform original
        parameter dtype"), its MixedPrecisionPolicy computes in bf16 anyway, and each rank holds
        1/world of it. LoRA layers go in before sharding, so FSDP2 shards them with their layer."""
        lora = self.lora is not None and not frozen
        model = load_model(folder, self.device, self.dtype if lora and not self.sharded else torch.float32)
        if lora:
            if self.args.lora_init:
                L.load_adapter(model, self.args.lora_init)
            else:
                L.add_lora(model, self.lora, seed=self.args.seed)
        if frozen:
            for p in model.parameters():
                p.requires_grad_(False)
        if self.sharded:
            scale = parallel.shard(model, self.args.shard, self.device, self.dtype, frozen=frozen)
            if not frozen:
                self.loss_scale = scale
        return model

    def logits(self, model, ids, pos, lengths):
        """The forward in the compute dtype (the logits may be bf16: every user casts them to fp32)."""
        with parallel.autocast(self.device, self.dtype, self.sharded):
            return response_logits(model, ids, pos, lengths)

    @torch.no_grad()
    def ref_logits(self, ids, pos, lengths):
        """The KL reference's logits: --ref's model, or with LoRA the base (the adapter switched off)."""
        if self.ref is not None:
            return self.logits(self.ref, ids, pos, lengths)
        with L.disabled(self.model):
            return self.logits(self.model, ids, pos, lengths)

    def my_micro_batches(self, shares):
        """This rank's micro-batches of its share (shares[r]: rank r's sequences). Sharded, every forward
        and backward is a collective, so every rank runs as many passes: a short rank's list is padded
        with None, an idle pass (idle_pass)."""
        mine = micro_batches(shares[self.rank], self.args.micro_batch_tokens)
        if self.sharded:
            most = max(len(micro_batches(s, self.args.micro_batch_tokens)) for s in shares)
            mine += [None] * (most - len(mine))
        return mine

    def idle_pass(self, train):
        """One token through the model (and the reference, and back when `train`): no effect on the
        update, but the same collectives, in the same order, as a real micro-batch."""
        ids = torch.full((1, 1), self.cfg.pad_token_id, dtype=torch.long, device=self.device)
        pos = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        with torch.set_grad_enabled(train):
            logits = self.logits(self.model, ids, pos, [1])
        if train and self.has_ref:
            self.ref_logits(ids, pos, [1])
        if train:
            (logits.float().sum() * 0.0).backward()

    def backward(self, loss):
        loss = loss * self.loss_scale
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def update(self):
        """Clips and applies the accumulated gradients; returns the gradient norm, or None when fp16's
        scaler found inf/NaN gradients and skipped the update (it then lowers the scale)."""
        if self.scaler is not None:
            self.scaler.unscale_(self.opt)
        max_norm = self.args.max_grad_norm if self.args.max_grad_norm > 0 else float("inf")
        norm = parallel.norm_value(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        if self.scaler is None:
            self.opt.step()
            return norm
        self.scaler.step(self.opt)
        self.scaler.update()
        return norm if math.isfinite(norm) else None

    def lr_at(self, step_index):
        a = self.args
        if a.warmup_steps > 0:
            return a.lr * min(1.0, (step_index + 1) / a.warmup_steps)
        return a.lr

    def mini_batches(self, seqs, step_index):
        """The step's sequences in K nearly equal mini-batches, after a seeded shuffle when K > 1.

        Every rank computes the same split (same seed, same batch), then takes its share of each."""
        k = min(self.args.mini_batches, len(seqs))
        if k <= 1:
            return [seqs]
        g = torch.Generator().manual_seed(self.args.seed * 1_000_003 + step_index)
        order = torch.randperm(len(seqs), generator=g).tolist()
        return [[seqs[i] for i in order[j::k]] for j in range(k)]

    @torch.no_grad()
    def behaviour_logprobs(self, shares):
        """log pi_old of each sequence's loss tokens under the weights before this step's first update.

        Needed when a step makes several updates: the PPO ratio of update 2 onwards must compare with
        the policy that generated the batch's scores, not with the weights of the previous update."""
        self.model.eval()
        for mb in self.my_micro_batches(shares):
            if mb is None:
                self.idle_pass(train=False)
                continue
            ids, pos, tgt, mask, *_rest, lengths = pack(mb, self.device, self.cfg.pad_token_id)
            logp = token_logprobs(self.logits(self.model, ids, pos, lengths), tgt).cpu()
            for i, s in enumerate(mb):
                s["old"] = logp[i, :int(mask[i].sum())].clone()
        self.model.train()

    def step(self, batch):
        a = self.args
        t0, c0 = time.time(), time.process_time()
        grpo = a.loss == "grpo"
        seqs = [sequence(rec) for rec in batch]
        if not seqs and getattr(batch, "step", None) is not None:
            return self.skip(batch, t0)
        n_loss_all = sum(loss_tokens(s) for s in seqs)
        if n_loss_all == 0:
            raise DataError("batch has no loss tokens (every loss_mask is 0)")
        parts = self.mini_batches(seqs, self.step_no)
        updates = len(parts) * a.epochs
        # Which log-probs the ratio divides by. "rollout": the engine's, as sampled. "recompute": the
        # trainer's before the first update; with one update that is the live forward detached (no
        # second pass), with several it is a no-grad pass over the batch before any update.
        from_rollout = grpo and a.old_logprobs == "rollout"
        precompute = grpo and not from_rollout and updates > 1
        if precompute:
            self.behaviour_logprobs([[s for part in parts for s in part[r::self.world]] for r in range(self.world)])
        correction = a.rollout_correction if grpo and not from_rollout else "none"
        # loss, clipped, kl_old, entropy, |rollout-old|, n_rollout, kl_ref, rollout_kl, tis_capped, n_tokens
        sums = torch.zeros(10, dtype=torch.float64)
        seq_masked = [0, 0]  # sequences masked by seq-mask correction, sequences seen (first epoch)
        grad_norms = []
        overflows = 0  # fp16 updates the loss scaler skipped
        n_micro = 0
        lr = batch.lr if getattr(batch, "lr", None) is not None else self.lr_at(self.step_no)
        for g in self.opt.param_groups:
            g["lr"] = lr
        for epoch in range(a.epochs):
            for part in parts:
                n_loss = sum(loss_tokens(s) for s in part)  # the mini-batch's global count of loss tokens
                if n_loss == 0:
                    continue
                self.opt.zero_grad(set_to_none=False)
                mbs = self.my_micro_batches([part[r::self.world] for r in range(self.world)])
                for mb in mbs:
                    if mb is None:
                        self.idle_pass(train=True)
                        continue
                    n_micro += 1
                    ids, pos, tgt, mask, rollout, has_rollout, adv, lengths = pack(mb, self.device,
                                                                                   self.cfg.pad_token_id)
                    logits = self.logits(self.model, ids, pos, lengths)
                    logp = token_logprobs(logits, tgt)
                    with torch.no_grad():
                        ent = entropy_from_logits(logits)
                    first = epoch == 0
                    if grpo:
                        if from_rollout:
                            old = rollout
                        elif precompute:
                            old = pack_old(mb, mask.shape, self.device)
                        else:
                            old = logp.detach()
                        ratio = torch.exp(logp - old)
                        pg1 = -adv * ratio
                        pg2 = -adv * ratio.clamp(1.0 - a.clip_low, 1.0 + a.clip_high)
                        tok = torch.maximum(pg1, pg2)
                        clipped = (pg2 > pg1).float()
                        kl_old = (old - logp).detach()
                        m_roll = mask * has_rollout
                        if correction != "none":
                            w, capped, masked_rows = correction_weights(old, rollout, m_roll, correction,
                                                                        a.rollout_correction_cap)
                            tok = tok * w
                            if first:
                                sums[8] += float((capped * m_roll).sum())
                                seq_masked[0] += masked_rows
                        if first:
                            # the trainer's log-probs before the update vs the engine's: with rollout
                            # old log-probs, those of each mini-batch's first forward
                            trainer = logp.detach() if from_rollout else old
                            d = (trainer - rollout) * m_roll  # log(pi_trainer / pi_rollout), sampled tokens
                            sums[7] += float(((torch.exp(d) - d - 1) * m_roll).sum())  # k3 of KL(rollout||trainer)
                            sums[4] += float(((rollout - trainer).abs() * m_roll).sum())
                            sums[5] += float(m_roll.sum())
                            seq_masked[1] += int((m_roll.sum(-1) > 0).sum())
                    else:
                        tok = -logp
                        clipped = torch.zeros_like(logp)
                        kl_old = torch.zeros_like(logp)
                        if first:
                            m_roll = mask * has_rollout
                            sums[4] += float(((rollout - logp.detach()).abs() * m_roll).sum())
                            sums[5] += float(m_roll.sum())
                    if self.has_ref:
                        with torch.no_grad():
                            ref_lp = token_logprobs(self.ref_logits(ids, pos, lengths), tgt)
                        d = (ref_lp - logp).clamp(-20, 20)
                        kl = (torch.exp(d) - d - 1).clamp(-10, 10)  # k3 estimator ("low_var_kl")
                        tok = tok + a.kl_coef * kl
                        sums[6] += float((kl.detach() * mask).sum())
                    if a.entropy_coef > 0:
                        tok = tok - a.entropy_coef * entropy_from_logits(logits)
                    self.backward((tok * mask).sum() / n_loss)
                    sums[0] += float((tok.detach() * mask).sum())
                    sums[1] += float((clipped * mask).sum())
                    sums[2] += float((kl_old * mask).sum())
                    sums[3] += float((ent * mask).sum())
                    sums[9] += float(mask.sum())
                if self.world > 1 and not self.sharded:  # FSDP2 reduce-scatters in the backward itself
                    for p in self.params:
                        if p.grad is None:
                            p.grad = torch.zeros_like(p)
                        dist.all_reduce(p.grad)
                norm = self.update()
                if norm is None:
                    overflows += 1
                else:
                    grad_norms.append(norm)
        if self.world > 1:
            sums = sums.to(self.device)  # nccl reduces device tensors only
            dist.all_reduce(sums)
            sums = sums.cpu()
            counts = torch.tensor(seq_masked, dtype=torch.float64, device=self.device)
            dist.all_reduce(counts)
            seq_masked = [int(x) for x in counts.cpu().tolist()]
        for s in seqs:
            s.pop("old", None)
        self.step_no += 1
        step_name = batch.step if getattr(batch, "step", None) is not None else self.step_no
        out = a.out.replace("{step}", str(step_name))
        tokens = sum(seq_len(s) for s in seqs)
        n_tok = max(float(sums[9]), 1.0)  # loss tokens summed over every update
        record = {
            "v": 1, "step": step_name, "policy": (a.policy or os.path.abspath(out)).replace("{step}", str(step_name)),
            "checkpoint": os.path.abspath(out), "loss": float(sums[0]) / n_tok,
            "pg_clipfrac": float(sums[1]) / n_tok, "approx_kl": float(sums[2]) / n_tok,
            "entropy": float(sums[3]) / n_tok, "grad_norm": sum(grad_norms) / max(1, len(grad_norms)),
            "grad_norm_max": max(grad_norms, default=0.0), "lr": lr,
            "sequences": len(seqs), "tokens": tokens, "seconds": round(time.time() - t0, 6),
            "cpu_seconds": round(time.process_time() - c0, 6),
            "loss_type": a.loss, "loss_tokens": int(n_loss_all), "updates": len(grad_norms),
            "mini_batches": len(parts), "epochs": a.epochs, "micro_batches": n_micro, "world_size": self.world,
            "dtype": a.dtype, "shard": a.shard, "threads": torch.get_num_threads(),
        }
        if overflows:
            record["skipped_updates"] = overflows
        if sums[5] > 0:
            record["logprob_mismatch"] = float(sums[4]) / float(sums[5])
            if grpo:
                record["rollout_kl"] = float(sums[7]) / float(sums[5])
                record["rollout_correction"] = correction
                if correction == "token-tis":
                    record["tis_capped_frac"] = float(sums[8]) / float(sums[5])
                elif correction == "seq-mask":
                    record["seq_masked_frac"] = seq_masked[0] / max(1, seq_masked[1])
        if self.has_ref:
            record["kl"] = float(sums[6]) / n_tok
        if self.lora is not None:
            record["adapter"] = True
        if self.rank == 0 or self.sharded:  # sharded: gathering the weights takes every rank
            self.save(out, record)
        if self.world > 1:
            dist.barrier()
        return record

    def skip(self, batch, t0):
        """A numbered step with nothing to learn from: the same weights, saved as that step."""
        self.step_no += 1
        out = self.args.out.replace("{step}", str(batch.step))
        record = {"v": 1, "step": batch.step, "policy": (self.args.policy or os.path.abspath(out)).replace(
                    "{step}", str(batch.step)), "checkpoint": os.path.abspath(out), "loss": 0.0, "pg_clipfrac": 0.0,
                "approx_kl": 0.0, "entropy": 0.0, "grad_norm": 0.0, "lr": 0.0, "sequences": 0, "tokens": 0,
                "seconds": round(time.time() - t0, 6), "loss_type": self.args.loss, "loss_tokens": 0, "updates": 0,
                "skipped": "empty batch: every group had equal rewards"}
        if self.lora is not None:
            record["adapter"] = True
        if self.rank == 0 or self.sharded:
            self.save(out, record)
        if self.world > 1:
            dist.barrier()
        return record

    def load_state(self, folder):
        """AdamW moments from optimizer.safetensors (no pickle: loads on any torch version)."""
        meta_path, moments_path = os.path.join(folder, STATE), os.path.join(folder, MOMENTS)
        if not os.path.isfile(meta_path):
            return
        with open(meta_path) as f:
            meta = json.load(f)
        # A different loss starts afresh (auto): AdamW's second moments from SFT are the size of SFT's
        # gradients, far above a policy gradient's, and with beta2 = 0.999 they would shrink every RL
        # update for ~a thousand steps.
        mode = self.args.optimizer_state
        if mode == "reset" or (mode == "auto" and meta.get("loss") not in (None, self.args.loss)):
            return
        self.step_no = int(meta["step"])
        if not os.path.isfile(moments_path):
            return
        moments = SafetensorsFile(moments_path)  # read one tensor at a time
        names = set(moments.names())
        for i, p in enumerate(self.params):
            if self.args.optimizer != "adamw" or f"exp_avg.{i}" not in names:
                continue
            if moments.shape(f"exp_avg.{i}") != tuple(p.shape):
                raise CheckpointError(f"{moments_path}: exp_avg.{i}: shape {list(moments.shape(f'exp_avg.{i}'))} "
                                      "differs from the model")
            # sharded: every rank reads the whole tensor and keeps its own part
            self.opt.state[p] = {"step": torch.tensor(float(moments.read(f"step.{i}"))),
                                 "exp_avg": parallel.like(p, moments.read(f"exp_avg.{i}")),
                                 "exp_avg_sq": parallel.like(p, moments.read(f"exp_avg_sq.{i}"))}

    def save(self, out, record=None):
        """Writes the checkpoint beside `out` and renames it into place, so a run killed mid-save
        leaves the previous checkpoint whole: a folder with trainer_state.json is always complete. The
        step's record is written inside (step.json), so a run killed before it printed the record
        still has it."""
        import shutil
        # Whole tensors on rank 0: sharded, gathering them is a collective every rank takes part in.
        keep = self.rank == 0
        state = self.model.state_dict()
        if self.lora is not None:
            # an adapter folder: the LoRA weights alone, in the checkpoint's dtype as a full save is
            # (bf16 for a bf16 base: half the bytes every sync sends; the fp32 moments stay exact)
            weights = parallel.gather({k: v for k, v in state.items() if L.is_lora_key(k)}, keep,
                                      checkpoint_dtype(self.cfg))
        else:
            if self.cfg.tie_word_embeddings:
                state.pop("lm_head.weight", None)  # the embedding matrix: gathered (and written) once
            weights = parallel.gather(state, keep, checkpoint_dtype(self.cfg))
        moments = {}
        for i, p in enumerate(self.params):
            st = self.opt.state.get(p)
            if st and "exp_avg" in st:
                moments[f"exp_avg.{i}"] = st["exp_avg"]
                moments[f"exp_avg_sq.{i}"] = st["exp_avg_sq"]
                moments[f"step.{i}"] = torch.tensor(float(st["step"]))
        moments = parallel.gather(moments, keep)
        if not keep:
            return
        out = os.path.normpath(out)
        tmp = f"{out}.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        if self.lora is not None:
            # PEFT's layout (served by vLLM/SGLang, loaded by peft); the base is named by its path. No
            # tokenizer copy: an adapter folder is what every sync sends, and the base has it.
            os.makedirs(tmp)
            L.write_adapter(tmp, L.adapter_state_dict(self.model, weights), self.model.lora_spec,
                            os.path.abspath(self.args.model), step=record["step"] if record else None)
        else:
            save_model(self.model, tmp, max_shard_bytes=self.args.max_shard_bytes or None, state=weights)
            copy_tokenizer(self.args.model if os.path.isdir(self.args.model) else out, tmp)
        save_safetensors(moments, os.path.join(tmp, MOMENTS))
        meta = {"step": self.step_no, "loss": self.args.loss, "optimizer": self.args.optimizer, "lr": self.args.lr,
                "betas": [self.args.beta1, self.args.beta2], "weight_decay": self.args.weight_decay}
        with open(os.path.join(tmp, STATE), "w") as f:
            json.dump(meta, f, indent=2)
        if record is not None:  # the Step record travels with its checkpoint: a resume can recover it
            with open(os.path.join(tmp, STEP_RECORD), "w") as f:
                f.write(json.dumps(record) + "\n")
        replace_folder(tmp, out)


def lora_spec(args):
    """The LoRA settings of the run (--lora-rank, or --lora-init's adapter), or None for full
    fine-tuning. A warm start takes the adapter's rank, alpha and targets; a --lora-rank or
    --lora-alpha given beside it must agree."""
    if args.lora_init:
        spec, _ = L.read_adapter(args.lora_init)
        where = os.path.join(args.lora_init, L.CONFIG)
        if args.lora_rank is not None and args.lora_rank != spec.r:
            raise L.AdapterError(f"{where}: r: {spec.r} but --lora-rank {args.lora_rank}")
        if args.lora_alpha is not None and float(args.lora_alpha) != spec.alpha:
            raise L.AdapterError(f"{where}: lora_alpha: {spec.alpha} but --lora-alpha {args.lora_alpha}")
        if args.lora_dropout not in (0, spec.dropout):
            raise L.AdapterError(f"{where}: lora_dropout: {spec.dropout} but --lora-dropout {args.lora_dropout}")
        if args.lora_targets != "all-linear" and L.parse_targets(args.lora_targets) != spec.targets:
            raise L.AdapterError(f"{where}: target_modules: {list(spec.targets)} but --lora-targets "
                                 f"{args.lora_targets}")
        return spec
    if args.lora_rank is None:
        given = [flag for flag, value, unset in (("--lora-alpha", args.lora_alpha, None),
                                                 ("--lora-dropout", args.lora_dropout, 0),
                                                 ("--lora-targets", args.lora_targets, "all-linear")) if value != unset]
        if given:  # else a forgotten --lora-rank would silently train the whole model
            raise SetupError(f"{', '.join(given)}: needs --lora-rank (or --lora-init)")
        return None
    alpha = args.lora_alpha if args.lora_alpha is not None else args.lora_rank  # scale 1
    return L.LoraSpec(r=int(args.lora_rank), alpha=alpha, dropout=args.lora_dropout,
                      targets=L.parse_targets(args.lora_targets))


class Config(dict):
    """The run's settings by attribute (`cfg.lr`). A key the driver did not send is a missing entry in
    src/backend/train-options.ts, and says so."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"train config: no '{name}' (declare it in src/backend/train-options.ts)")


def read_config(argv):
    p = argparse.ArgumentParser(prog="rstar-backend train")
    p.add_argument("--config", required=True, type=json.loads,
                   help="every setting, as one JSON object (src/backend/train-options.ts)")
    return Config(p.parse_args(argv).config)


def main(argv):
    cfg = read_config(argv)
    try:
        trainer = Trainer(cfg)
        if trainer.rank == 0:
            batches = read_batches(sys.stdin)
        while True:
            item = [next(batches, None) if trainer.rank == 0 else None]
            if trainer.world > 1:
                dist.broadcast_object_list(item, src=0)
            if item[0] is None:
                break
            record = trainer.step(item[0])
            if trainer.rank == 0:
                sys.stdout.write(json.dumps(record) + "\n")
                sys.stdout.flush()
    except SetupError as e:  # the precision or sharding cannot run here: a usage/setup error
        sys.stderr.write(f"rstar train-step: {e}\n")
        return 2
    except (DataError, CheckpointError) as e:
        sys.stderr.write(f"rstar train-step: {e}\n")
        return 1
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0
