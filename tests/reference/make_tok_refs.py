#!/usr/bin/env python3
"""Reference tokenizations for qrl's tokenizer conformance test (tests/unit/test_tokenizer.c).

Encodes every string of tests/reference/tokenizer_corpus.txt (JSON lines, one string each)
with HuggingFace tokenizers and writes tests/fixtures/tokenizer/<name>_refs.jsonl, one line
per string: {"text": ..., "ids": [...], "decoded": ...} (ids without BOS/EOS, special tokens
recognised; "decoded" = HF's decode(ids, skip_special_tokens=False)).

  qwen         ../shared/data/qwen_tokenizer (vocab.json + merges.txt + tokenizer_config.json),
               through transformers' AutoTokenizer when installed, else rebuilt with
               `tokenizers` exactly as transformers converts Qwen2Tokenizer
  tinystories  ../shared/data/tinystories_656k/tokenizer.json
  bl_qwen, bl_gpt2, sp_meta
               small tokenizer.json files in tests/fixtures/tokenizer/<name>/, trained here
               with `tokenizers` when absent (kept once made), so the tokenizer.json code paths
               qrl supports (Split + ByteLevel + NFC with [a, b] merges; ByteLevel regex with
               add_prefix_space, "a b" merges and ignore_merges; Metaspace with byte fallback)
               each have a reference

Needs only `pip install tokenizers` (transformers optional).  Run from the repo root:
  python3 tests/reference/make_tok_refs.py [--data ../shared/data]
"""
import argparse
import json
import os
import sys

import tokenizers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers, Regex

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
FIX = "tests/fixtures/tokenizer"


def qwen_tokenizer(qdir):
    """Returns (encode(text) -> ids, decode(ids) -> text)."""
    try:
        from transformers import AutoTokenizer
        t = AutoTokenizer.from_pretrained(qdir)
        return (lambda s: t.encode(s, add_special_tokens=False),
                lambda ids: t.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False),
                "transformers " + __import__("transformers").__version__)
    except ImportError:
        pass
    tok = Tokenizer(models.BPE.from_file(os.path.join(qdir, "vocab.json"), os.path.join(qdir, "merges.txt"),
                                         unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    cfg = json.load(open(os.path.join(qdir, "tokenizer_config.json")))
    added = sorted(cfg["added_tokens_decoder"].items(), key=lambda kv: int(kv[0]))
    for _, a in added:
        tok.add_tokens([tokenizers.AddedToken(a["content"], special=a["special"], normalized=a["normalized"],
                                              lstrip=a["lstrip"], rstrip=a["rstrip"], single_word=a["single_word"])])
    return (lambda s: tok.encode(s, add_special_tokens=False).ids,
            lambda ids: tok.decode(ids, skip_special_tokens=False), "tokenizers (rebuilt Qwen2)")


def train_corpus(data):
    lines = [json.loads(l)["question"] for l in open(os.path.join(data, "gsm8k/train.jsonl"))][:3000]
    lines += [json.loads(l) for l in open("tests/reference/tokenizer_corpus.txt")]
    return lines


def make_bl_qwen(path, data):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=900, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(train_corpus(data), tr)
    tok.add_tokens([tokenizers.AddedToken("<think>", special=False, normalized=False)])
    tok.save(path)


def make_bl_gpt2(path, data):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(train_corpus(data), tr)
    tok.add_special_tokens([tokenizers.AddedToken("<mask>", lstrip=True, special=True, normalized=False)])
    tok.save(path)
    # the older file layout: merges as "a b" strings; and ignore_merges (Llama-3 style)
    j = json.load(open(path))
    j["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    j["model"]["ignore_merges"] = True
    json.dump(j, open(path, "w"), ensure_ascii=False, indent=1)


def make_sp_meta(path, data):
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="\u2581", prepend_scheme="first")])
    tr = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=120)
    tok.train_from_iterator(train_corpus(data), tr)
    tok.save(path)
    j = json.load(open(path))
    vocab = j["model"]["vocab"]
    n = max(vocab.values()) + 1
    for b in range(256):  # sentencepiece byte pieces, appended after the learned ones
        vocab.setdefault("<0x%02X>" % b, n + b)
    json.dump(j, open(path, "w"), ensure_ascii=False, indent=1)


def file_tokenizer(path):
    t = Tokenizer.from_file(path)
    return (lambda s: t.encode(s, add_special_tokens=False).ids,
            lambda ids: t.decode(ids, skip_special_tokens=False), "tokenizers")


def write_refs(name, enc, dec, corpus):
    out = os.path.join(FIX, name + "_refs.jsonl")
    with open(out, "w") as f:
        for s in corpus:
            ids = enc(s)
            f.write(json.dumps({"text": s, "ids": ids, "decoded": dec(ids)}, ensure_ascii=False) + "\n")
    print("wrote", out, len(corpus), "strings")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("QRL_DATA_DIR", "../shared/data"))
    a = ap.parse_args()
    corpus = [json.loads(l) for l in open("tests/reference/tokenizer_corpus.txt", encoding="utf-8")]
    os.makedirs(FIX, exist_ok=True)
    versions = ["tokenizers " + tokenizers.__version__]
    enc, dec, how = qwen_tokenizer(os.path.join(a.data, "qwen_tokenizer"))
    versions.append("qwen via " + how)
    write_refs("qwen", enc, dec, corpus)
    enc, dec, _ = file_tokenizer(os.path.join(a.data, "tinystories_656k/tokenizer.json"))
    write_refs("tinystories", enc, dec, corpus)
    for name, make in (("bl_qwen", make_bl_qwen), ("bl_gpt2", make_bl_gpt2), ("sp_meta", make_sp_meta)):
        path = os.path.join(FIX, name, "tokenizer.json")
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            make(path, a.data)
            print("trained", path)
        enc, dec, _ = file_tokenizer(path)
        write_refs(name, enc, dec, corpus)
    with open(os.path.join(FIX, "VERSIONS.txt"), "w") as f:
        f.write("made by tests/reference/make_tok_refs.py with: " + "; ".join(versions) +
                "; python " + sys.version.split()[0] + "\n")


if __name__ == "__main__":
    main()
