#pragma once
// The linear layers of the models users prune, as weight shapes (R = out_features, K = in_features), and the token
// counts a model runs them at, from decode (1) to long prefill (8192): the `models` suite.
#include <array>
#include <cstdint>
#include <string_view>

namespace nmkit::bench {

struct ModelLinear {
  std::string_view model, layers;
  int64_t r, k;
};

// Llama attention: q and o are hidden x hidden, k and v kv_heads x 128 wide; MLP gate/up R = intermediate, down
// K = intermediate. The 70B shard is one GPU's at tensor-parallel 8 (column-parallel q, k, v, gate, up split R;
// row-parallel o and down split K). BERT: the attention projections, the MLP's two.
inline constexpr std::array kModelLinears = {
    ModelLinear{"llama-2-7b", "q k v o", 4096, 4096},      ModelLinear{"llama-2-7b", "gate up", 11008, 4096},
    ModelLinear{"llama-2-7b", "down", 4096, 11008},        ModelLinear{"llama-2-13b", "q k v o", 5120, 5120},
    ModelLinear{"llama-2-13b", "gate up", 13824, 5120},    ModelLinear{"llama-2-13b", "down", 5120, 13824},
    ModelLinear{"llama-3-8b", "k v", 1024, 4096},          ModelLinear{"llama-3-8b", "gate up", 14336, 4096},
    ModelLinear{"llama-3-8b", "down", 4096, 14336},        ModelLinear{"llama-3-70b", "q o", 8192, 8192},
    ModelLinear{"llama-3-70b", "k v", 1024, 8192},         ModelLinear{"llama-3-70b", "gate up", 28672, 8192},
    ModelLinear{"llama-3-70b", "down", 8192, 28672},       ModelLinear{"llama-3-70b tp8", "q", 1024, 8192},
    ModelLinear{"llama-3-70b tp8", "k v", 128, 8192},      ModelLinear{"llama-3-70b tp8", "o", 8192, 1024},
    ModelLinear{"llama-3-70b tp8", "gate up", 3584, 8192}, ModelLinear{"llama-3-70b tp8", "down", 8192, 3584},
    ModelLinear{"bert-base", "q k v o", 768, 768},         ModelLinear{"bert-base", "intermediate", 3072, 768},
    ModelLinear{"bert-base", "output", 768, 3072},         ModelLinear{"bert-large", "q k v o", 1024, 1024},
    ModelLinear{"bert-large", "intermediate", 4096, 1024}, ModelLinear{"bert-large", "output", 1024, 4096},
};
// Llama-3-8B's q and o (4096 x 4096) are Llama-2-7B's row, listed once.

inline constexpr std::array<int64_t, 12> kModelTokens = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};

}  // namespace nmkit::bench
