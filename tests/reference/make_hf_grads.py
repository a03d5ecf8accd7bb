#!/usr/bin/env python3
"""PyTorch reference gradients for the training engine (tests/unit/test_model_train_hf.c).

Run on the GPU machine (torch + transformers; CPU is used, the models are tiny), after
make_hf_refs.py made the fixtures:
    python3 tests/reference/make_hf_grads.py tests/fixtures/hf

For each fixture folder tests/fixtures/hf/<name>/ (config.json, model.safetensors,
reference.json) it loads the checkpoint in float32 (BF16 files upcast, as the C loader
does) with attn_implementation="eager", takes reference.json's input_ids (one sequence of
n tokens), and computes
    logprob_t = log_softmax(logits_t)[ids[t + 1]]        t = 0 .. n-2
    loss      = sum_t c_t * logprob_t,   c_t = ((t * 7) % 5 - 2) / 3.0
then loss.backward() and writes
    grads.safetensors   F32 gradient of every named parameter, under its HF name
                        (a tied lm_head is one parameter: reported once, under
                        model.embed_tokens.weight, as named_parameters() lists it)
    grads.json          {"input_ids", "coef" [n-1], "logprobs" [n-1], "loss",
                         "params": [names], "torch_version", "transformers_version"}
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def coef(t):
    return ((t * 7) % 5 - 2) / 3.0


def one(d):
    with open(os.path.join(d, "reference.json")) as f:
        ref = json.load(f)
    ids = torch.tensor([ref["input_ids"]], dtype=torch.long)
    n = ids.shape[1]
    m = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager",
                                             dtype=torch.float32).float()
    m.train(False)  # no dropout (all zero anyway); gradients still flow
    m.zero_grad(set_to_none=True)
    logits = m(ids).logits[0].float()  # [n, V]
    logp = torch.log_softmax(logits, dim=-1)
    tgt = ids[0, 1:]
    lp = logp[:-1].gather(1, tgt[:, None])[:, 0]  # [n-1]
    c = torch.tensor([coef(t) for t in range(n - 1)], dtype=torch.float32)
    loss = (c * lp).sum()
    loss.backward()
    grads, names = {}, []
    for name, p in m.named_parameters():
        if p.grad is None:
            continue
        grads[name] = p.grad.detach().float().contiguous().cpu()
        names.append(name)
    save_file(grads, os.path.join(d, "grads.safetensors"))
    out = {
        "input_ids": ref["input_ids"],
        "coef": c.tolist(),
        "logprobs": lp.detach().tolist(),
        "loss": float(loss),
        "params": names,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(d, "grads.json"), "w") as f:
        json.dump(out, f)
    gmax = max(float(g.abs().max()) for g in grads.values())
    print(f"{os.path.basename(d)}: loss={float(loss):.6f} params={len(names)} max|grad|={gmax:.4g}")


def main(root):
    torch.manual_seed(0)
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if os.path.isfile(os.path.join(d, "reference.json")):
            one(d)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/hf")
