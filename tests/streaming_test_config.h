// The streamed sweep's test config, shared by the CPU test (tests/experiments/
// test_streaming.cpp) and the CUDA one (tests/gpu/test_measurer.cpp): three layers of a
// RoPE recording with sink heads and GQA; uniform, KIVI-2 and two strategies that read
// the calibration statistics (entropy; uniform with sink tokens chosen by the attention
// they receive), with attribution of point 0; layers streamed, backend = "cpu".
#pragma once
#include <string>

namespace kvb::test {

// The streamed sweep's [data.synthetic] table alone (three layers, GQA, sink heads,
// RoPE), for configs built around the same data.
inline const std::string kStreamingSynthetic = R"(
[data.synthetic]
layers = 3
q_heads = 4
kv_heads = 2
head_dim = 32
tokens = 1024
entropy_mean = 5.0
recency = 1.0
sink_heads = 1
outlier_channels = 2
rope = true
rho_first = 0.05
calibration_queries = 32
)";

inline const std::string kStreamingConfig = R"(
backend = "cpu"

[data]
stream_layers = true
)" + kStreamingSynthetic + R"(
[[strategy]]
type = "uniform"
key_format = "int{bits}-asym-ch32"
value_format = "int{bits}-asym-g32"
[strategy.vars]
bits = [2, 4]

[[strategy]]
preset = "kivi-2"

[[strategy]]
type = "entropy"
budget_bpe = 4.0
family = "int{b}-asym-g32"
alpha = 0.25

[[strategy]]
type = "uniform"
key_format = "int2-asym-g32"
value_format = "int2-asym-g32"
sink_tokens = 2
sink_token_select = "attention"

[calibration]
positions = "900..963:8"

[metrics]
positions = "964..1023:4"

[attribution]
points = [0]
)";

}  // namespace kvb::test
