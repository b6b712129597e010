# The benchmark configurations' shapes for the shell benchmarks, as bench/bench_configs.h has
# them for train_bench and bench/pytorch_baseline.py: "input|hidden,...|output|micro-batch".
widths_of() { case $1 in
  mlp1k) echo "1024|1024,1024,1024|1024|512" ;;
  mlp8k) echo "8192|8192,8192,8192|8192|4096" ;;
  seed) echo "1024||16|64" ;;
esac; }
