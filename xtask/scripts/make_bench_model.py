"""Write a ~1.1B-parameter llama-architecture GGUF with random F16 weights, for benchmarks.

Shape of a Llama-3.2-1B-class model with a 32k vocabulary: 16 layers, n_embd 2048,
32 query heads over 8 KV heads (head size 64), n_ff 8192, separate output head. Weights are
seeded normal noise scaled for unit-variance activations, so the numbers a benchmark sees
(bandwidth, not quality) are those of a real model of that size. `cargo xtask bench-models`
quantizes the result to Q4_K_M with llama-quantize.
"""

import argparse
import os
from pathlib import Path

import numpy as np
import gguf

SEED = 1234
N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_VOCAB = 16, 2048, 32, 8, 8192, 32000


def byte_to_unicode() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping, extra = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    rng = np.random.default_rng(SEED)

    tokens = byte_to_unicode()
    # One real merge: llama.cpp refuses a BPE vocabulary without merges.
    tokens.append("\u0120t")
    tokens += [f"<filler_{i}>" for i in range(N_VOCAB - len(tokens) - 1)]
    tokens.append("<|endoftext|>")
    types = [int(gguf.TokenType.NORMAL)] * (N_VOCAB - 1) + [int(gguf.TokenType.CONTROL)]
    eos = N_VOCAB - 1
    head_dim = N_EMBD // N_HEAD
    kv = N_HEAD_KV * head_dim

    def matrix(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in), dtype=np.float32) / np.sqrt(n_in)).astype(np.float16)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    tmp = args.out.with_suffix(".tmp")
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name("bench-llama-1b")
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(5e5)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["\u0120 t"])
    w.add_bos_token_id(eos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)

    w.add_tensor("token_embd.weight", (0.15 * rng.standard_normal((N_VOCAB, N_EMBD), dtype=np.float32)).astype(np.float16))
    for i in range(N_LAYER):
        p = f"blk.{i}"
        w.add_tensor(f"{p}.attn_norm.weight", norm(N_EMBD))
        w.add_tensor(f"{p}.attn_q.weight", matrix(N_EMBD, N_EMBD))
        w.add_tensor(f"{p}.attn_k.weight", matrix(kv, N_EMBD))
        w.add_tensor(f"{p}.attn_v.weight", matrix(kv, N_EMBD))
        w.add_tensor(f"{p}.attn_output.weight", matrix(N_EMBD, N_EMBD))
        w.add_tensor(f"{p}.ffn_norm.weight", norm(N_EMBD))
        w.add_tensor(f"{p}.ffn_gate.weight", matrix(N_FF, N_EMBD))
        w.add_tensor(f"{p}.ffn_up.weight", matrix(N_FF, N_EMBD))
        w.add_tensor(f"{p}.ffn_down.weight", matrix(N_EMBD, N_FF))
    w.add_tensor("output_norm.weight", norm(N_EMBD))
    w.add_tensor("output.weight", matrix(N_VOCAB, N_EMBD))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, args.out)
    print(args.out)


if __name__ == "__main__":
    main()
