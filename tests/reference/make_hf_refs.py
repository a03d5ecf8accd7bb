#!/usr/bin/env python3
"""Build tiny random HuggingFace checkpoints and their reference outputs.

Run on the GPU machine (it has torch + transformers; CPU is used, the models are tiny):
    python3 tests/reference/make_hf_refs.py tests/fixtures/hf

For each architecture it writes tests/fixtures/hf/<name>/:
    config.json, model.safetensors      the checkpoint, saved by transformers
    reference.json                      {"input_ids", "logits" [pos][vocab] (teacher-forced),
                                         "greedy": {"prompt_ids", "max_new_tokens", "output_ids"},
                                         "torch_dtype", "transformers_version", "min_top2_margin"}
Logits are computed in float32 (for BF16 checkpoints: BF16 weights upcast to float32), which is
what the C engine computes, so the comparison bound stays tight.
"""
import json
import os
import sys
import zlib

import torch
import transformers
from transformers import (AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config)

try:
    from transformers import Qwen3Config
except ImportError:  # older transformers
    Qwen3Config = None

V5 = int(transformers.__version__.split(".")[0]) >= 5
VOCAB = 256
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-5, initializer_range=0.08, bos_token_id=1, eos_token_id=2)


def rope(theta, scaling=None):
    """RoPE arguments in the layout of the installed transformers (4.x or 5.x)."""
    if V5:
        params = {"rope_type": "default", "rope_theta": theta}
        params.update(scaling or {})
        return {"rope_parameters": params}
    return {"rope_theta": theta, "rope_scaling": scaling}


def configs():
    yield "llama", "float32", LlamaConfig(**COMMON, **rope(10000.0), tie_word_embeddings=False)
    yield "llama3_rope", "float32", LlamaConfig(
        **COMMON, tie_word_embeddings=True,
        **rope(500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}))
    yield "mistral", "float32", MistralConfig(**COMMON, **rope(1000000.0),
                                              tie_word_embeddings=False, sliding_window=None)
    yield "qwen2", "float32", Qwen2Config(**COMMON, **rope(1000000.0), tie_word_embeddings=True,
                                          use_sliding_window=False)
    if Qwen3Config is not None:
        q3 = dict(COMMON, head_dim=32)  # head_dim != hidden/heads, as in real Qwen3
        yield "qwen3", "float32", Qwen3Config(**q3, **rope(1000000.0), tie_word_embeddings=True,
                                              use_sliding_window=False)
        yield "qwen3_bf16", "bfloat16", Qwen3Config(**q3, **rope(1000000.0),
                                                     tie_word_embeddings=False,
                                                     use_sliding_window=False)


def main(out_dir):
    torch.manual_seed(1234)
    for name, dtype, cfg in configs():
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float()
        with torch.no_grad():  # give the untrained nets some contrast so greedy has clear winners
            for n, p in model.named_parameters():
                if "norm" in n:
                    p.copy_(1.0 + 0.2 * torch.randn_like(p))
                elif n.endswith("bias"):
                    p.copy_(0.1 * torch.randn_like(p))
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        save_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        model.to(save_dtype).save_pretrained(d, safe_serialization=True)
        # reload exactly what was saved, compute in float32
        m = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").float().eval()
        g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        ids = torch.randint(3, VOCAB, (1, 24), generator=g)
        ids[0, 0] = 1
        with torch.no_grad():
            logits = m(ids).logits[0].float()
            top2 = logits.topk(2, dim=-1).values
            margin = float((top2[:, 0] - top2[:, 1]).min())
            prompt = ids[:, :8]
            out = m.generate(prompt, max_new_tokens=16, do_sample=False, eos_token_id=None,
                             pad_token_id=0, min_new_tokens=16)
        ref = {
            "input_ids": ids[0].tolist(),
            "logits": [[float(x) for x in row] for row in logits],
            "greedy": {"prompt_ids": prompt[0].tolist(), "max_new_tokens": 16,
                       "output_ids": out[0, prompt.shape[1]:].tolist()},
            "torch_dtype": dtype,
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "min_top2_margin": margin,
        }
        with open(os.path.join(d, "reference.json"), "w") as f:
            json.dump(ref, f)
        for junk in ("generation_config.json",):
            p = os.path.join(d, junk)
            if os.path.exists(p):
                os.remove(p)
        print(f"{name}: dtype={dtype} margin={margin:.4f} greedy={ref['greedy']['output_ids']}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/hf")
