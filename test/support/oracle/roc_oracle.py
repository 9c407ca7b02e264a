"""Reference model of rStar2-Agent's GRPO-RoC down-sampling, written for rstar's tests.

It follows the release's batch-level structure (rstar2_agent/down_sample/reject_sampling.py
`reject_equal_reward`, then roc.py `resample_of_correct`) with a float32 reward tensor and
torch.allclose, Python's `re` and `round`, so rstar's TypeScript port is checked against the real
library semantics rather than against itself.

stdin: {"cases": [{"params": {...}, "records": [trajectory, ...]}, ...]}
stdout: {"results": [{"kept": [id, ...], "penalty": {id: {...}}, "stats": {...}}, ...]}
"""

import json
import re
import sys

import numpy as np
import torch

RESPONSE_RE = re.compile(r"<tool_response>.*?</tool_response>", re.DOTALL)
ANSWER_RE = re.compile(r"<answer>.*?</answer>", re.DOTALL)
TURN_RE = re.compile(r"<\|im_start\|>assistant.*?<\|im_end\|>", re.DOTALL)


def tool_error(text):
    blocks = RESPONSE_RE.findall(text)
    if not blocks:
        return 0.5, 0, 0
    bad = sum(1 for b in blocks if "error" in b.lower())
    return bad / len(blocks), bad, len(blocks)


def answer_format(text):
    if "<answer>" not in text or "</answer>" not in text:
        return 1.0, 0
    closed = len(ANSWER_RE.findall(text))
    if text.count("<answer>") != closed or text.count("</answer>") != closed:
        return 1.0, closed
    turns = len(TURN_RE.findall(text))
    if turns == 0:
        return 1.0, closed
    return min((closed - 1) / turns, 1.0), closed


def run_case(params, records):
    keep = params["keep"]
    min_pos = params["min_pos"]
    min_neg = params["min_neg"]
    mode = params.get("penalty", "rstar")
    # Batch order: within a problem, rollouts sit in sample order (a stable sort keeps groups interleaved).
    batch = sorted(records, key=lambda r: r["sample"])
    uids = np.array([r["problem_id"] for r in batch], dtype=object)
    scores = torch.tensor([r["reward"] for r in batch], dtype=torch.float32)

    stats = {"equal_reward": 0, "equal_reward_all_zero": 0, "equal_reward_non_zero": 0}
    alive = torch.ones(len(batch), dtype=torch.bool)
    for uid in np.unique(uids):
        m = torch.from_numpy(uids == uid)
        r = scores[m]
        if torch.allclose(r[0], r):
            stats["equal_reward"] += 1
            if torch.allclose(torch.zeros_like(r), r):
                stats["equal_reward_all_zero"] += 1
            else:
                stats["equal_reward_non_zero"] += 1
            if params["reject_equal"]:
                alive[m] = False
    stats["rejected_equal"] = stats["equal_reward"] if params["reject_equal"] else 0

    idx = [i for i in range(len(batch)) if alive[i]]
    batch = [batch[i] for i in idx]
    uids = uids[idx]
    scores = scores[idx]

    weights = np.zeros(len(batch))
    tool = [tool_error(r["text"]) for r in batch]
    fmt = [answer_format(r["text"]) for r in batch]
    if mode in ("rstar", "tool-error"):
        weights += np.array([t[0] for t in tool])
    if mode in ("rstar", "format"):
        weights += np.array([f[0] for f in fmt])
    responses = sum(t[2] for t in tool)
    errors = sum(t[1] for t in tool)
    stats["tool_responses"] = responses
    stats["tool_errors"] = errors
    stats["tool_error_ratio"] = errors / responses if responses else 0
    stats["tool_error_penalty_mean"] = float(np.mean([t[0] for t in tool])) if tool else 0
    tags = [f[1] for f in fmt]
    stats["answer_tags"] = {
        "per_rollout_mean": sum(tags) / len(tags) if tags else 0,
        "zero": sum(1 for t in tags if t == 0),
        "one": sum(1 for t in tags if t == 1),
        "more": sum(1 for t in tags if t > 1),
    }

    outcome = {"too_small": 0, "kept_whole": 0, "both_short": 0, "sampled": 0, "size_mismatch": 0}
    keep_mask = torch.zeros(len(batch), dtype=torch.bool)
    for uid in np.unique(uids):
        where = np.where(uids == uid)[0]
        if len(where) < keep:
            outcome["too_small"] += 1
            continue
        if len(where) == keep:
            outcome["kept_whole"] += 1
            keep_mask[where] = True
            continue
        rs = scores[torch.from_numpy(uids == uid)]
        neg = [(i, w) for i, r, w in zip(where, rs, weights[where]) if r <= 0]
        pos = [(i, w) for i, r, w in zip(where, rs, weights[where]) if r > 0]
        pos.sort(key=lambda p: p[1])
        n_neg = round(len(neg) * keep / len(where))
        n_pos = round(len(pos) * keep / len(where))
        if n_neg < min_neg and n_pos < min_pos:
            outcome["both_short"] += 1
            keep_mask[where] = True
            continue
        if n_neg <= min(min_neg, len(neg)):
            n_neg = min(min_neg, len(neg))
            n_pos = keep - n_neg
        if n_pos <= min(min_pos, len(pos)):
            n_pos = min(min_pos, len(pos))
            n_neg = keep - n_pos
        picked = [p[0] for p in pos[:n_pos]] + [p[0] for p in neg[:n_neg]]
        outcome["sampled"] += 1
        # The release asserts here; rstar keeps the selection and counts it.
        if len(picked) != keep:
            outcome["size_mismatch"] += 1
        keep_mask[picked] = True
    stats.update(outcome)

    kept = [batch[i] for i in range(len(batch)) if keep_mask[i]]
    penalty = {}
    for i, r in enumerate(batch):
        if keep_mask[i]:
            penalty[r["id"]] = {"tool_error": tool[i][0], "format": fmt[i][0], "total": float(weights[i])}
    stats["records_out"] = len(kept)
    stats["groups_out"] = len({r["problem_id"] for r in kept})
    stats["positives_out"] = sum(1 for i in range(len(batch)) if keep_mask[i] and scores[i] > 0)
    return {"kept": sorted(r["id"] for r in kept), "penalty": penalty, "stats": stats}


def main():
    cases = json.load(sys.stdin)["cases"]
    json.dump({"results": [run_case(c["params"], c["records"]) for c in cases]}, sys.stdout)


if __name__ == "__main__":
    main()
